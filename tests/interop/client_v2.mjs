// An agent built on @modelcontextprotocol/client 2.x (TS SDK v2), negotiating the stateless
// 2026-07-28 protocol (versionNegotiation 'auto': server/discover, no initialize), plus the
// Tasks extension through @modelcontextprotocol/ext-tasks. Commands on stdin, one JSON line per
// answer on stdout (see agent.mjs).

import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

import { authHeaders, callScenarios, onerror, recordingFetch, serve, thrown, withClient } from './agent.mjs';
import { taskScenarios } from './tasks_v2.mjs';

async function connect(command) {
    const recorder = recordingFetch();
    const transport = new StreamableHTTPClientTransport(new URL(command.url), {
        fetch: recorder.fetch, requestInit: { headers: authHeaders(command) },
    });
    const client = new Client({ name: 'carmy-interop-client-v2', version: '2.4.0' },
                              { versionNegotiation: { mode: command.mode ?? 'auto' } });
    client.onerror = onerror;
    await client.connect(transport);
    return { client, transport, exchanges: recorder.exchanges, fetch: recorder.fetch };
}

async function call(client, { name, arguments: args, meta }, options) {
    const params = { name, arguments: args ?? {}, ...(meta ? { _meta: meta } : {}) };
    try {
        return { result: await client.callTool(params, options) };
    } catch (error) {
        return { thrown: thrown(error) };
    }
}

const scenarios = {
    async connect(command) {
        try {
            return await withClient(connect, command, async ({ client }) => ({
                protocolVersion: client.getNegotiatedProtocolVersion(),
                era: client.getProtocolEra(),
                serverVersion: client.getServerVersion(),
                capabilities: client.getServerCapabilities(),
                instructions: client.getInstructions(),
                discover: client.getDiscoverResult(),
            }));
        } catch (error) {
            return { thrown: thrown(error) };
        }
    },

    async list(command) {
        return withClient(connect, command, async ({ client }) => ({
            protocolVersion: client.getNegotiatedProtocolVersion(),
            listed: await client.listTools(),
        }));
    },

    ...callScenarios(connect, call),

    ...taskScenarios(connect, withClient),
};

await serve(scenarios);
