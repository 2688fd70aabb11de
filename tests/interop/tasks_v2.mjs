// Tasks (SEP-2663, extension io.modelcontextprotocol/tasks, 2026-07-28) through
// @modelcontextprotocol/ext-tasks on a connected v2 Client. The SDK's codecs do not know the
// extension's wire shapes (a tools/call answered with a task, tasks/*), so ext-tasks asks its host
// for a raw request path (rawDispatch) and the request framing (v2RequestFraming): here one plain
// Streamable HTTP POST per request, with the headers the v2 transport sends.

import { createTaskSessionFromClient, DispatchError } from '@modelcontextprotocol/ext-tasks/client';

import { authHeaders, emit, messagesIn, nextMessage, thrown } from './agent.mjs';

const CLIENT_INFO = { name: 'carmy-interop-client-v2', version: '2.4.0' };

/** ext-tasks' raw request path: POST the request, return its JSON-RPC response. */
function rawDispatch(command, fetch) {
    let count = 0;
    return async (request, options = {}) => {
        const message = { jsonrpc: '2.0', id: `raw-${++count}`, ...request };
        const headers = {
            'content-type': 'application/json', accept: 'application/json, text/event-stream',
            'mcp-protocol-version': message.params?._meta?.['io.modelcontextprotocol/protocolVersion'] ?? '2026-07-28',
            'mcp-method': message.method, ...authHeaders(command),
        };
        if (message.method === 'tools/call') headers['mcp-name'] = message.params.name;
        if (message.method.startsWith('tasks/')) headers['mcp-name'] = message.params.taskId;  // SEP-2663
        const exchange = { body: '' };
        let response;
        try {
            response = await fetch(command.url, { method: 'POST', headers, body: JSON.stringify(message),
                                                  signal: options.signal });
            exchange.body = await response.text();
        } catch (error) {
            throw new DispatchError(`${message.method}: ${error}`, true, { cause: error });
        }
        const answer = safeMessages(exchange).find(m => m.id === message.id);
        if (answer?.error) return { kind: 'error', error: answer.error };
        if (answer && 'result' in answer) return { kind: 'result', result: answer.result };
        throw new DispatchError(`${message.method}: HTTP ${response.status} without a response: ${exchange.body}`);
    };
}

function safeMessages(exchange) {
    try {
        return messagesIn(exchange);
    } catch {
        return [];
    }
}

function outcomeOf(outcome) {
    return { status: outcome.status, result: outcome.result, error: outcome.error && thrown(outcome.error) };
}

export function taskScenarios(connect, withClient) {
    return {
        // A call through an ext-tasks session. Answers {capabilities, kind, taskId, outcome}; a call
        // that became a task says so first ({"event": "task", taskId, status}, from tasks/get) and,
        // with "cancel", sends it a tasks/update, then waits for the test's go to cancel it
        // (tasks/cancel).
        async task(command) {
            return withClient(connect, command, async ({ client, fetch }) => {
                await client.listTools();
                const session = createTaskSessionFromClient(client, {
                    endpointId: 'carmy-interop',
                    rawDispatch: rawDispatch(command, fetch),
                    v2RequestFraming: {
                        protocolVersion: client.getNegotiatedProtocolVersion(), clientInfo: CLIENT_INFO,
                        clientCapabilities: {},
                    },
                });
                try {
                    // Without the extension the call would not be a task and could not be cancelled
                    // as one: say so at once rather than run the tool for as long as it lasts.
                    if (command.cancel && !session.capabilities.execution) {
                        return { capabilities: session.capabilities, kind: null };
                    }
                    const { name, arguments: args } = command.call;
                    const execution = await session.callTool(name, args ?? {});
                    const answer = { capabilities: session.capabilities, kind: execution.kind };
                    if (execution.kind === 'task') {
                        const taskId = execution.handle.taskId;
                        const snapshot = await session.task(taskId).snapshot();
                        Object.assign(answer, { taskId, status: snapshot.status });
                        emit({ id: command.id, event: 'task', taskId, status: snapshot.status });
                        if (command.cancel) {
                            // tasks/update with no input responses: Carmy's tools ask for none, so
                            // it is only acknowledged.
                            answer.update = await session.task(taskId).update({}).then(() => 'ok', thrown);
                            await nextMessage();
                            await execution.cancel();
                        }
                    }
                    const { outcome } = await execution.settle();
                    return { ...answer, outcome: outcomeOf(outcome) };
                } finally {
                    await session.close();
                }
            });
        },
    };
}
