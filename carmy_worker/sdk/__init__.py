"""The tool SDK: ``Toolbox`` and its decorator, the ``Context`` a tool receives, ``ToolError``,
and the JSON Schemas derived from a tool's types. Everything a tool module imports; nothing here
talks to Redis or knows about arq."""
