// An agent built on @modelcontextprotocol/sdk 1.x (the SDK most agents, desktop assistants, IDE
// agents and the Inspector use): the initialize handshake, 2025-11-25. Commands on stdin, one
// JSON line per answer on stdout (see agent.mjs).

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

import { authHeaders, callScenarios, onerror, recordingFetch, serve, thrown, withClient } from './agent.mjs';

async function connect(command) {
    const recorder = recordingFetch();
    const transport = new StreamableHTTPClientTransport(new URL(command.url), {
        fetch: recorder.fetch, requestInit: { headers: authHeaders(command) },
    });
    const client = new Client({ name: 'carmy-interop-sdk-v1', version: '1.32.2' });
    client.onerror = onerror;
    await client.connect(transport);
    return { client, transport, exchanges: recorder.exchanges };
}

async function call(client, { name, arguments: args, meta }, options) {
    const params = { name, arguments: args ?? {}, ...(meta ? { _meta: meta } : {}) };
    try {
        return { result: await client.callTool(params, undefined, options) };
    } catch (error) {
        return { thrown: thrown(error) };
    }
}

const scenarios = {
    async connect(command) {
        try {
            return await withClient(connect, command, async ({ client, transport }) => ({
                protocolVersion: transport.protocolVersion,
                serverVersion: client.getServerVersion(),
                capabilities: client.getServerCapabilities(),
                instructions: client.getInstructions(),
            }));
        } catch (error) {
            return { thrown: thrown(error) };
        }
    },

    async list(command) {
        return withClient(connect, command, async ({ client, transport }) => ({
            protocolVersion: transport.protocolVersion,
            listed: await client.listTools(),
        }));
    },

    ...callScenarios(connect, call),
};

await serve(scenarios);
