/* Small line charts in SVG for the console, with no library: CarmyCharts.draw(svg, points, value,
   spanMs) draws value(point) over the last spanMs of points ({t: ms, ...}, oldest first) into an
   <svg viewBox="0 0 600 120">. Only elements and attributes are set, never a style: the page's
   policy allows no inline style, and the look is in overview.css (.grid, .area, .line). */
(function () {
  'use strict';
  const NS = 'http://www.w3.org/2000/svg';
  const WIDTH = 600;
  const HEIGHT = 120;
  const PAD = 4;
  // Points further apart than this leave a gap in the line: seconds in which Redis did not answer.
  const GAP_MS = 3000;

  // The top of the scale: 1, 2 or 5 times a power of ten, at least the highest value.
  function niceTop(highest) {
    if (!(highest > 0)) return 1;
    const power = Math.pow(10, Math.floor(Math.log10(highest)));
    for (const m of [1, 2, 5]) {
      if (highest <= m * power) return m * power;
    }
    return 10 * power;
  }

  // Runs of points with no gap between them, as [x, y] in the viewBox.
  function segments(points, value, start, spanMs, top) {
    const runs = [];
    let run = null;
    let last = null;
    for (const p of points) {
      const x = ((p.t - start) / spanMs) * WIDTH;
      const y = HEIGHT - PAD - (Math.max(0, value(p)) / top) * (HEIGHT - 2 * PAD);
      if (run === null || p.t - last > GAP_MS) {
        run = [];
        runs.push(run);
      }
      run.push([x, y]);
      last = p.t;
    }
    return runs;
  }

  function element(name, attributes) {
    const node = document.createElementNS(NS, name);
    for (const key of Object.keys(attributes)) node.setAttribute(key, attributes[key]);
    return node;
  }

  function xy(point) {
    return point[0].toFixed(1) + ' ' + point[1].toFixed(1);
  }

  function draw(svg, points, value, spanMs) {
    const end = points.length ? points[points.length - 1].t : 0;
    const start = end - spanMs;
    const shown = points.filter((p) => p.t >= start);
    const top = niceTop(shown.reduce((high, p) => Math.max(high, value(p)), 0));
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    for (const level of [0, 0.5, 1]) {
      const y = (HEIGHT - PAD - level * (HEIGHT - 2 * PAD)).toFixed(1);
      svg.appendChild(element('line', {class: 'grid', x1: 0, x2: WIDTH, y1: y, y2: y,
                                       'vector-effect': 'non-scaling-stroke'}));
    }
    const baseline = (HEIGHT - PAD).toFixed(1);
    for (const run of segments(shown, value, start, spanMs, top)) {
      const line = 'M' + run.map(xy).join(' L');
      const first = run[0][0].toFixed(1);
      const lastX = run[run.length - 1][0].toFixed(1);
      svg.appendChild(element('path', {class: 'area', d: line + ' L' + lastX + ' ' + baseline + ' L' + first + ' ' + baseline + ' Z'}));
      svg.appendChild(element('path', {class: 'line', d: line, 'vector-effect': 'non-scaling-stroke'}));
    }
    return top;
  }

  window.CarmyCharts = {draw: draw, niceTop: niceTop};
})();
