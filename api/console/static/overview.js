/* The live overview: /console/live (Server-Sent Events) sends the charts' points of the last
   minutes ("history"), then a "frame" a second, until "end"; this keeps the page's figures, tables and charts
   (charts.js) current. Text goes in with textContent only, never as HTML. Formats are those of
   api/console/figures.py. */
(function () {
  'use strict';
  const root = document.getElementById('overview');
  if (!root || !window.EventSource || !window.CarmyCharts) return;
  const SPAN_MS = 5 * 60 * 1000;
  const status = document.getElementById('live-status');
  const series = {
    completions: (p) => p.completions,
    errors: (p) => p.errors,
    queued: (p) => p.queued,
  };
  let points = [];

  function rate(v) { return v < 10 ? v.toFixed(1) : v.toFixed(0); }

  function duration(ms) {
    if (ms === null || ms === undefined) return '–';
    if (ms < 10) return ms.toFixed(1) + ' ms';
    return ms < 1000 ? ms.toFixed(0) + ' ms' : (ms / 1000).toFixed(1) + ' s';
  }

  function field(name, text) {
    for (const node of root.querySelectorAll('[data-field="' + name + '"]')) node.textContent = text;
  }

  function say(text, state) {
    status.textContent = text;
    status.className = 'live-status ' + state;
  }

  function cell(row, text, options) {
    const td = document.createElement('td');
    const opts = options || {};
    if (opts.num) td.className = 'num';
    if (opts.badge) {
      const span = document.createElement('span');
      span.className = 'badge ' + opts.badge;
      span.textContent = text;
      td.appendChild(span);
    } else if (opts.code) {
      const code = document.createElement('code');
      code.textContent = text;
      td.appendChild(code);
    } else {
      td.textContent = text;
    }
    row.appendChild(td);
  }

  function table(name, items, fill, empty, columns) {
    const body = root.querySelector('[data-table="' + name + '"]');
    if (!body) return;
    const rows = document.createDocumentFragment();
    for (const item of items) {
      const row = document.createElement('tr');
      fill(row, item);
      rows.appendChild(row);
    }
    if (!items.length) {
      const row = document.createElement('tr');
      const td = document.createElement('td');
      td.colSpan = columns;
      td.className = 'muted';
      td.textContent = empty;
      row.appendChild(td);
      rows.appendChild(row);
    }
    while (body.firstChild) body.removeChild(body.firstChild);
    body.appendChild(rows);
  }

  function worker(row, w) {
    cell(row, w.id, {code: true});
    cell(row, w.host || '–');
    cell(row, w.pid ? String(w.pid) : '–');
    cell(row, w.group.slice(0, 12), {code: true});
    cell(row, String(w.busy), {num: true});
    cell(row, w.slots ? String(w.slots) : '?', {num: true});
    if (!w.alive) cell(row, 'dead', {badge: 'bad'});
    else if (w.draining) cell(row, 'draining', {badge: 'warn'});
    else cell(row, 'alive', {badge: 'ok'});
  }

  function queue(row, q) {
    cell(row, q.group.slice(0, 12), {code: true});
    cell(row, String(q.due), {num: true});
    cell(row, String(q.length), {num: true});
  }

  function tool(row, t) {
    if (t.errors) row.className = 'failing';
    cell(row, t.tool, {code: true});
    cell(row, rate(t.completions), {num: true});
    cell(row, rate(t.errors), {num: true});
    cell(row, duration(t.p50), {num: true});
    cell(row, duration(t.p99), {num: true});
    cell(row, String(t.runs), {num: true});
  }

  function show(frame) {
    if (frame.error) {
      say(frame.error, 'lost');
      return;
    }
    const p = frame.point;
    say('Live, as of ' + new Date(p.t).toISOString().slice(11, 19) + ' UTC', 'live');
    field('completions', rate(p.completions));
    field('errors', rate(p.errors));
    field('queued', String(p.queued));
    field('pending', String(p.pending));
    field('in_flight', String(p.in_flight));
    const alive = frame.workers.filter((w) => w.alive);
    field('workers', alive.length + ' of ' + frame.workers.length);
    field('slots', alive.reduce((n, w) => n + w.busy, 0) + ' of ' + alive.reduce((n, w) => n + w.slots, 0));
    field('window', 'over the last ' + Math.round(frame.window) + ' s');
    field('tools_left_out', frame.tools_left_out ? 'and ' + frame.tools_left_out + ' quieter tools' : '');
    table('workers', frame.workers, worker, 'No worker.', 7);
    table('queues', frame.queues, queue, 'No queue.', 3);
    table('tools', frame.tools, tool, 'No execution finished in the last seconds.', 6);
  }

  function add(point) {
    if (!points.length || point.t > points[points.length - 1].t) points.push(point);
    while (points.length && points[0].t < point.t - SPAN_MS) points.shift();
  }

  function draw() {
    for (const name of Object.keys(series)) {
      const svg = root.querySelector('[data-chart="' + name + '"]');
      if (!svg) continue;
      const top = window.CarmyCharts.draw(svg, points, series[name], SPAN_MS);
      field('max-' + name, points.length ? '(scale 0–' + top + ')' : '');
    }
  }

  // The server ends each stream after a few seconds with an "end" event (so that a stopping API
  // is not held up by open pages): the next one is opened at once, and starts with the history.
  let source = null;
  function connect() {
    source = new EventSource(root.getAttribute('data-live'));
    source.addEventListener('history', (event) => {
      points = JSON.parse(event.data).points;
      draw();
    });
    source.addEventListener('frame', (event) => {
      const frame = JSON.parse(event.data);
      if (frame.point) add(frame.point);
      show(frame);
      draw();
    });
    source.addEventListener('end', () => {
      source.close();
      connect();
    });
    source.addEventListener('error', () => {
      // A closed source is not retried by the browser (the session ended: a 401): say to reload.
      if (source.readyState === EventSource.CLOSED) say('Not live: reload the page (sign in again if asked).', 'lost');
      else say('Reconnecting…', 'lost');
    });
  }
  connect();
  window.addEventListener('pagehide', () => source.close());
  window.addEventListener('pageshow', (event) => { if (event.persisted) connect(); });  // back from the cache
})();
