// What both client scripts share: the command loop on stdin, JSON lines on stdout, a fetch that
// records each HTTP exchange the SDK makes, and the capture of everything the SDK reports as an
// error (onerror, console.error) so that tests can assert the client saw nothing it complained of.
//
// Protocol: each stdin line is a command {"id", "scenario", "url", "token"?, ...}; the script runs
// its scenarios one at a time and answers each with one line {"id", "scenario", "errors", ...}.
// A scenario may print progress lines {"id", "event"} first and read further stdin lines (the
// cancel scenario waits for {"id", "abort": true}). By hand, either way:
//   node sdk_v1.mjs http://127.0.0.1:8000/mcp list '{"token": "..."}'
//   echo '{"id":1,"scenario":"list","url":"http://127.0.0.1:8000/mcp"}' | node sdk_v1.mjs

import { createInterface } from 'node:readline';

const lines = createInterface({ input: process.stdin, crlfDelay: Infinity })[Symbol.asyncIterator]();

/** The next command line from the test, parsed; undefined once stdin is closed. */
export async function nextMessage() {
    for (;;) {
        const { value, done } = await lines.next();
        if (done) return undefined;
        if (value.trim()) return JSON.parse(value);
    }
}

export function emit(message) {
    process.stdout.write(JSON.stringify(message) + '\n');
}

/** Everything reported as an error while a scenario runs: the SDK's onerror and console.error. */
export const reported = [];
const consoleError = console.error.bind(console);
console.error = (...args) => {
    reported.push(args.map(a => (a instanceof Error ? `${a.name}: ${a.message}` : String(a))).join(' '));
    consoleError(...args);
};
export function onerror(error) {
    const text = `onerror: ${error instanceof Error ? `${error.name}: ${error.message}` : String(error)}`;
    reported.push(text);
    consoleError(text);
}

/** A thrown error as the test reads it. */
export function thrown(error) {
    return { name: error?.constructor?.name ?? typeof error, code: error?.code, message: String(error?.message ?? error),
             data: error?.data };
}

/**
 * A fetch that keeps every exchange: the JSON-RPC messages sent, the HTTP status, and, once the
 * response body has been read to its end, the body's text. ``ended`` resolves then (or when the
 * body is abandoned: the client aborted the request).
 */
export function recordingFetch() {
    const exchanges = [];
    async function fetchAndRecord(input, init) {
        const exchange = { method: init?.method ?? 'GET', sent: parseBody(init?.body), status: undefined, body: '' };
        let finish;
        exchange.ended = new Promise(resolve => { finish = resolve; });
        exchanges.push(exchange);
        let response;
        try {
            response = await fetch(input, init);
        } catch (error) {
            exchange.failed = String(error);
            finish();
            throw error;
        }
        exchange.status = response.status;
        if (!response.body) {
            finish();
            return response;
        }
        const reader = response.body.getReader();
        const decoder = new TextDecoder();
        const body = new ReadableStream({
            async pull(controller) {
                try {
                    const { value, done } = await reader.read();
                    if (done) {
                        exchange.body += decoder.decode();
                        finish();
                        controller.close();
                        return;
                    }
                    exchange.body += decoder.decode(value, { stream: true });
                    controller.enqueue(value);
                } catch (error) {
                    exchange.aborted = String(error);
                    finish();
                    controller.error(error);
                }
            },
            cancel(reason) {
                exchange.aborted = String(reason);
                finish();
                return reader.cancel(reason);
            },
        }, { highWaterMark: 0 });
        return new Response(body, { status: response.status, statusText: response.statusText, headers: response.headers });
    }
    return { fetch: fetchAndRecord, exchanges };
}

function parseBody(body) {
    if (typeof body !== 'string') return undefined;
    try {
        return JSON.parse(body);
    } catch {
        return body;
    }
}

/** The JSON-RPC messages in a response body, SSE or JSON. */
export function messagesIn(exchange) {
    const text = exchange.body.trim();
    if (!text) return [];
    if (text.startsWith('{') || text.startsWith('[')) return [JSON.parse(text)].flat();
    return text.split(/\r?\n/)
        .filter(line => line.startsWith('data:') && line.slice(5).trim())
        .map(line => JSON.parse(line.slice(5)));
}

/** The exchange that carried the JSON-RPC request ``method`` (the last one sent). */
export function exchangeOf(exchanges, method) {
    return exchanges.filter(e => e.sent?.method === method).at(-1);
}

/**
 * The cancel scenario: start a call (``start(signal)``), say so, give up on it (AbortSignal) when
 * the test says, then wait for the call's HTTP exchange to end and for one more round trip, so
 * that anything the server still sends for the call has reached the SDK. The answer: how the
 * call ended for the SDK, and what its response stream carried.
 */
export async function giveUp(command, { client, exchanges }, start) {
    const abort = new AbortController();
    const pending = start(abort.signal);
    emit({ id: command.id, event: 'calling' });
    await nextMessage();
    abort.abort('the user gave up');
    const answer = await pending;
    const stream = exchangeOf(exchanges, 'tools/call');
    if (!stream) return { ...answer, stream: null };  // given up before it was sent
    const ended = await within(stream.ended.then(() => true), 15000, false);
    await client.listTools(undefined, { cacheMode: 'bypass' });  // v2 has no ping on 2026-07-28
    return { ...answer, stream: { requestId: stream.sent.id, ended, status: stream.status, aborted: stream.aborted ?? stream.failed,
                                  messages: messagesIn(stream) } };
}

/**
 * Run ``scenarios[command.scenario](command)`` for each command on stdin, one at a time; or, given
 * arguments (URL SCENARIO [JSON]), that one command.
 */
export async function serve(scenarios) {
    const [url, name, args] = process.argv.slice(2);
    const once = url === undefined ? undefined : { id: 1, scenario: name, url, ...JSON.parse(args ?? '{}') };
    for (;;) {
        const command = once ?? await nextMessage();
        if (command === undefined) return;
        reported.length = 0;
        const scenario = scenarios[command.scenario];
        let answer;
        try {
            if (!scenario) throw new Error(`no scenario named ${command.scenario}`);
            answer = await scenario(command);
        } catch (error) {
            answer = { failed: thrown(error), stack: error?.stack };
        }
        emit({ id: command.id, scenario: command.scenario, errors: [...reported], ...answer });
        if (once) return;
    }
}

/**
 * ``body(session)`` with a client connected by ``connect(command)``, then closed. The answer's
 * ``errors`` are those reported until the body returns: what the SDK reports once we close it
 * (aborted streams, some of them after close() has returned) is our doing, not the server's.
 */
export async function withClient(connect, command, body) {
    const session = await connect(command);
    try {
        const answer = await body(session);
        return { ...answer, errors: [...reported] };
    } finally {
        await session.client.close();
    }
}

/** ``promise``'s value, or ``otherwise`` if it takes more than ``ms``: a bound on a wait, not a pause. */
export async function within(promise, ms, otherwise) {
    let timer;
    const late = new Promise(resolve => { timer = setTimeout(() => resolve(otherwise), ms); });
    try {
        return await Promise.race([promise, late]);
    } finally {
        clearTimeout(timer);
    }
}

export function authHeaders(command) {
    return command.token ? { Authorization: `Bearer ${command.token}` } : {};
}

/** The scenarios both clients run alike, after tools/list as an agent makes its calls (the SDK
 * then knows each tool's outputSchema and checks every result against it). ``call(client, spec,
 * options)`` is the client's own way to make one call. */
export function callScenarios(connect, call) {
    return {
        async calls(command) {
            return withClient(connect, command, async ({ client }) => {
                await client.listTools();
                const results = [];
                for (const spec of command.calls) results.push(await call(client, spec));
                return { results };
            });
        },

        async progress(command) {
            return withClient(connect, command, async ({ client }) => {
                await client.listTools();
                const progress = [];
                const answer = await call(client, command.call, { onprogress: p => progress.push(p) });
                return { ...answer, progress };
            });
        },

        async cancel(command) {
            return withClient(connect, command, async session => {
                await session.client.listTools();
                return giveUp(command, session, signal => call(session.client, command.call, { signal }));
            });
        },
    };
}
