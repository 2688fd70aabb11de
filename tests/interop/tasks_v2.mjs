export const taskScenarios = {};
