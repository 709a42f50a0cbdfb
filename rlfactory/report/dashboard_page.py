"""The live dashboard's one page: inline CSS, inline JS and SVG charts, no external assets (it works offline).

The JS polls the server's JSON endpoints (dashboard.py): new metrics.jsonl rows of each run since the last poll, the
newest transcripts under the current filters, and per-tool latencies from those transcripts. Charts overlay the runs,
one colour per run. Metric names are looked up under both engines' names (rlfactory's `loss/*`, verl's `actor/*`).
Text from run folders reaches the DOM through `textContent` or server-side `html.escape` (the viewer's fragments),
never as markup. Lines of metrics.jsonl the server skipped as bad are counted in a note under the header; a poll
that fails says why there and the next one tries again.

Left out: zoom, smoothing controls, run comparison tables.
"""
from __future__ import annotations

import html
import json

from rlfactory.report.charts import SECTIONS, ZERO_WHEN_ABSENT, chart_meanings
from rlfactory.report.viewer import VIEWER_CSS

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{position:sticky;top:0;background:#1d2330;color:#fff;padding:8px 16px;z-index:3}
header h1{font-size:17px;margin:0}
#runs span{margin-right:14px;font-size:13px}#runs i{display:inline-block;width:12px;height:12px;margin-right:4px;
  vertical-align:middle;border-radius:2px}
main.dash{padding:10px 16px}
h2{font-size:15px;margin:14px 0 6px;border-bottom:1px solid #d6dae1}
.grid{display:flex;flex-wrap:wrap;gap:10px}
.chart{background:#fff;border:1px solid #d6dae1;border-radius:6px;padding:4px 6px;width:360px}
.chart .t{font-size:12px;font-weight:600}.chart .k{font-size:11px;color:#667}
.chart svg{width:348px;height:150px}
.chart .empty{font-size:12px;color:#889;padding:40px 0;text-align:center}
.legend{font-size:11px}.legend span{margin-right:8px}
table{border-collapse:collapse;background:#fff;font-size:13px}
td,th{border:1px solid #d6dae1;padding:2px 8px;text-align:right}td:first-child,th:first-child{text-align:left}
#tlist tr{cursor:pointer}#tlist tr:hover{background:#eef5ff}#tlist tr.open{background:#d7e8ff}
#filters label{margin-right:10px;font-size:13px}
#viewer{margin-top:10px}
.hidden-section{display:none}
#notes .note{font-size:12px;color:#ffd27a}#error{font-size:12px;color:#ff9a8a}
"""

_JS = r"""
(function(){
  var POLL_MS = parseInt(new URLSearchParams(location.search).get('poll') || '1000', 10);
  var COLORS = ['#2f7de1','#e1572f','#2faa5a','#9b4fd1','#c9a100','#1fb3b3','#d14f8f','#666'];
  var DASHES = ['', '5,3', '2,2', '8,3,2,3'];
  var runs = [], state = [], polls = 0, openId = null;
  var SPEC = JSON.parse(document.getElementById('chart-spec').textContent);  // rlfactory/report/charts.py
  var OPTIONAL = {};  // shown as 0 when a run logs no such key (no timeouts, no cache)
  SPEC.zero.forEach(function(id){ OPTIONAL[id] = 0; });
  function $(id){ return document.getElementById(id); }
  function el(tag, attrs, text){
    var e = document.createElement(tag);
    for (var k in (attrs || {})) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function get(url){
    return fetch(url, {cache: 'no-store'}).then(function(r){
      if (r.ok) return r.json();
      return r.text().then(function(t){
        var msg = t; try { msg = JSON.parse(t).error || t; } catch (e) {}
        throw new Error(url.split('?')[0] + ' answered ' + r.status + ': ' + msg);
      });
    });
  }
  // The server sends only objects as rows (run_watch.py skips other lines); anything else counts as an empty row
  // here rather than stopping every later render. Maps keyed by metric names have no prototype: a metric may be
  // called "__proto__" or "constructor".
  function asRow(r){ return r !== null && typeof r === 'object' && !Array.isArray(r) ? r : {}; }
  function dict(){ return Object.create(null); }
  function num(v){ return typeof v === 'number' && isFinite(v); }
  function fmt(v){
    if (!num(v)) return '–';
    if (Math.abs(v) >= 1000 || v === Math.round(v)) return String(Math.round(v));
    return Math.abs(v) < 1e-3 ? v.toExponential(2) : v.toPrecision(3);
  }
  function seriesOf(rows, key, dflt){
    var pts = [];
    rows.forEach(function(r){
      var v = r[key];
      if (!num(v) && dflt !== undefined && num(r.step)) v = dflt;
      if (num(v) && num(r.step)) pts.push([r.step, v]);
    });
    return pts;
  }
  function pick(rows, keys){
    for (var i = 0; i < keys.length; i++)
      for (var j = 0; j < rows.length; j++) if (num(rows[j][keys[i]])) return keys[i];
    return null;
  }
  function box(parent, id, title){
    var c = $('c-' + id);
    if (!c) {
      c = el('div', {'class': 'chart', id: 'c-' + id, 'data-points': '0'});
      c.appendChild(el('div', {'class': 't'}, title));
      c.appendChild(el('div', {'class': 'k'}));
      c.appendChild(el('div', {'class': 'plot'}));
      c.appendChild(el('div', {'class': 'legend'}));
      parent.appendChild(c);
    }
    return c;
  }
  // series: [{label, color, dash, pts}]
  function draw(c, series, keyText){
    var all = [];
    series.forEach(function(s){ all = all.concat(s.pts); });
    c.dataset.points = String(all.length);
    c.querySelector('.k').textContent = keyText || '';
    c.querySelector('.t').title = (keyText || '').split(', ').map(function(k){ return SPEC.meanings[k]; })
      .filter(function(m){ return m; }).join('\n');  // from the metrics registry
    var plot = c.querySelector('.plot'), legend = c.querySelector('.legend');
    plot.innerHTML = ''; legend.innerHTML = '';
    if (!all.length) { plot.appendChild(el('div', {'class': 'empty'}, 'no data yet')); return; }
    var W = 348, H = 150, L = 46, R = 8, T = 8, B = 20;
    var xs = all.map(function(p){ return p[0]; }), ys = all.map(function(p){ return p[1]; });
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 === y0) { if (y0 === 0) y1 = 1; else { var d = Math.abs(y0) * 0.1; y0 -= d; y1 += d; } }  // 0s: 0..1
    function X(v){ return L + (v - x0) / (x1 - x0) * (W - L - R); }
    function Y(v){ return H - B - (v - y0) / (y1 - y0) * (H - T - B); }
    var NS = 'http://www.w3.org/2000/svg', svg = document.createElementNS(NS, 'svg');
    svg.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
    function add(tag, a, text){
      var e = document.createElementNS(NS, tag);
      for (var k in a) e.setAttribute(k, a[k]);
      if (text !== undefined) e.textContent = text;
      svg.appendChild(e); return e;
    }
    for (var i = 0; i <= 3; i++) {
      var yv = y0 + (y1 - y0) * i / 3, yy = Y(yv);
      add('line', {x1: L, x2: W - R, y1: yy, y2: yy, stroke: '#e3e6eb'});
      add('text', {x: L - 4, y: yy + 4, 'text-anchor': 'end', 'font-size': 10, fill: '#556'}, fmt(yv));
    }
    add('text', {x: L, y: H - 5, 'font-size': 10, fill: '#556'}, 'step ' + fmt(x0));
    add('text', {x: W - R, y: H - 5, 'text-anchor': 'end', 'font-size': 10, fill: '#556'}, fmt(x1));
    series.forEach(function(s){
      if (!s.pts.length) return;
      var d = s.pts.map(function(p, i){ return (i ? 'L' : 'M') + X(p[0]).toFixed(1) + ' ' + Y(p[1]).toFixed(1); });
      add('path', {d: d.join(''), fill: 'none', stroke: s.color, 'stroke-width': 1.6, 'stroke-dasharray': s.dash});
      s.pts.forEach(function(p){
        add('circle', {cx: X(p[0]).toFixed(1), cy: Y(p[1]).toFixed(1), r: 2, fill: s.color, 'class': 'pt'});
      });
      var lg = el('span', {}, '— ' + s.label + ' ' + fmt(s.pts[s.pts.length - 1][1]));
      lg.style.color = s.color;
      legend.appendChild(lg);
    });
    plot.appendChild(svg);
  }
  function perRun(parent, spec){
    var c = box(parent, spec[0], spec[1]), series = [], used = [];
    state.forEach(function(st, i){
      var key = pick(st.rows, spec[2]);
      var dflt = spec[0] in OPTIONAL && st.rows.length ? OPTIONAL[spec[0]] : undefined;
      if (!key && dflt === undefined) return;
      key = key || spec[2][0];
      if (used.indexOf(key) < 0) used.push(key);
      series.push({label: runs[i].name, color: COLORS[i % COLORS.length], dash: '', pts: seriesOf(st.rows, key, dflt)});
    });
    draw(c, series, used.join(', '));
  }
  function keysLike(re){
    var seen = dict();
    state.forEach(function(st){ st.rows.forEach(function(r){ for (var k in r) if (re.test(k)) seen[k] = 1; }); });
    return Object.keys(seen).sort();
  }
  function multi(parent, spec){
    var c = box(parent, spec[0], spec[1]), series = [], rx = new RegExp(spec[2]), found = dict();
    state.forEach(function(st){ st.rows.forEach(function(r){
      for (var k in r) if (!(k in found)) {
        var m = rx.exec(k);
        if (m) found[k] = m.slice(1).filter(function(g){ return g; })[0] || k;
      }
    }); });
    var keys = Object.keys(found).sort();
    state.forEach(function(st, i){
      keys.forEach(function(k, j){
        var pts = seriesOf(st.rows, k);
        if (pts.length) series.push({label: (runs.length > 1 ? runs[i].name + ' ' : '') + found[k],
                                     color: COLORS[j % COLORS.length], dash: DASHES[i % DASHES.length], pts: pts});
      });
    });
    draw(c, series, '');
  }
  function quantile(xs, q){
    if (!xs.length) return NaN;
    var s = xs.slice().sort(function(a, b){ return a - b; });
    return s[Math.min(s.length - 1, Math.floor(q * s.length))];
  }
  function toolTable(){
    var body = $('tool-rows'); body.innerHTML = '';
    state.forEach(function(st, i){
      var tools = dict();
      st.rows.forEach(function(r){
        for (var k in r) {
          var m = /^tools\/(.+)\/(calls|errors)$/.exec(k);
          if (m && num(r[k])) { tools[m[1]] = tools[m[1]] || {calls: 0, errors: 0}; tools[m[1]][m[2]] += r[k]; }
        }
      });
      Object.keys(tools).sort().forEach(function(name){
        var lat = (st.latencies && Object.prototype.hasOwnProperty.call(st.latencies, name) &&
                   Array.isArray(st.latencies[name])) ? st.latencies[name] : [],
            t = tools[name], tr = el('tr', {'data-tool': name});
        var rate = t.calls ? (100 * t.errors / t.calls).toFixed(1) + ' %' : '–';
        [runs[i].name, name, fmt(t.calls), fmt(t.errors), rate, fmt(1000 * quantile(lat, 0.5)),
         fmt(1000 * quantile(lat, 0.9)), fmt(1000 * quantile(lat, 1)), String(lat.length)]
          .forEach(function(v){ tr.appendChild(el('td', {}, v)); });
        body.appendChild(tr);
      });
    });
  }
  function notes(){
    var box = $('notes'); box.innerHTML = '';
    state.forEach(function(st, i){
      if (!st.bad) return;
      var last = st.badNotes.length ? ' (newest: ' + st.badNotes[st.badNotes.length - 1] + ')' : '';
      var n = el('div', {'class': 'note', 'data-run': String(i), 'data-bad': String(st.bad)},
                 runs[i].name + ': ' + st.bad + ' bad line' + (st.bad > 1 ? 's' : '') +
                 ' in metrics.jsonl skipped' + last);
      n.title = st.badNotes.join('\n');
      box.appendChild(n);
    });
  }
  function render(){
    notes();
    SPEC.sections.forEach(function(sec){
      var grid = $(sec.id);
      if (sec.only_if) {
        var on = keysLike(new RegExp(sec.only_if)).length > 0;
        $(sec.id + '-section').classList.toggle('hidden-section', !on);
        if (!on) return;
      }
      sec.charts.forEach(function(spec){ perRun(grid, spec); });
      sec.multi.forEach(function(spec){ multi(grid, spec); });
    });
    toolTable();
    var sel = $('f-run');
    if (sel.options.length !== runs.length) {
      sel.innerHTML = '';
      runs.forEach(function(r, i){ sel.appendChild(el('option', {value: String(i)}, r.name)); });
    }
    var reasons = keysLike(/^rollout\/finish_/).map(function(k){ return k.replace('rollout/finish_', ''); });
    var fsel = $('f-finish');
    if (fsel.options.length !== reasons.length + 1) {
      var keep = fsel.value; fsel.innerHTML = '';
      fsel.appendChild(el('option', {value: ''}, 'all'));
      reasons.forEach(function(r){ fsel.appendChild(el('option', {value: r}, r)); });
      fsel.value = keep;
    }
    $('runs').innerHTML = '';
    runs.forEach(function(r, i){
      var st = state[i], s = el('span', {});
      var sw = el('i', {}); sw.style.background = COLORS[i % COLORS.length]; s.appendChild(sw);
      s.appendChild(document.createTextNode(r.name + ': step ' + st.rows.length +
        (r.total_steps ? '/' + r.total_steps : '') + (r.finished ? ' (finished)' : ' (live)')));
      $('runs').appendChild(s);
    });
  }
  function filters(){
    var q = 'run=' + $('f-run').value + '&finish=' + encodeURIComponent($('f-finish').value);
    if ($('f-rmin').value !== '') q += '&rmin=' + encodeURIComponent($('f-rmin').value);
    if ($('f-rmax').value !== '') q += '&rmax=' + encodeURIComponent($('f-rmax').value);
    if ($('f-toolerr').checked) q += '&tool_error=1';
    return q;
  }
  function listTranscripts(){
    if (!runs.length) return Promise.resolve();
    var run = $('f-run').value || '0';
    return get('api/transcripts?' + filters()).then(function(items){
      var body = $('tlist'); body.innerHTML = '';
      items.forEach(function(t){
        var tr = el('tr', {'data-id': t.id, 'data-run': run});
        if (t.id === openId) tr.className = 'open';
        [String(t.step), t.id, fmt(t.reward), t.finish, String(t.turns), String(t.response_tokens),
         String(t.tool_calls), String(t.tool_errors), String(t.images || 0), t.tree || ''].forEach(function(v){
          tr.appendChild(el('td', {}, v));
        });
        tr.addEventListener('click', function(){ openTranscript(run, t.id); });
        body.appendChild(tr);
      });
      $('tcount').textContent = items.length + ' shown (newest first)';
    });
  }
  function buildTokens(t){
    var box = t.querySelector('.tokens');
    if (!box || box.dataset.built) return;
    JSON.parse(t.querySelector('script.tokdata').textContent).forEach(function(tok){
      var s = el('span', {'class': 'tok m' + tok[1]}, tok[0]);
      s.title = 'id ' + tok[2] + ' · mask ' + tok[1] + (tok[1] ? ' · logprob ' + tok[3] : '');
      box.appendChild(s);
    });
    box.dataset.built = '1';
  }
  function openTranscript(run, id){
    openId = id;
    return get('api/transcript?run=' + run + '&id=' + encodeURIComponent(id)).then(function(d){
      var v = $('viewer');
      v.innerHTML = d.html;  // rendered and escaped server-side by the transcript viewer
      Array.prototype.forEach.call(v.querySelectorAll('.tree a[data-id]'), function(a){  // a branched group's tree
        a.addEventListener('click', function(ev){ ev.preventDefault(); openTranscript(run, a.dataset.id); });
      });
      var t = v.querySelector('.traj');
      if (!t) return;
      var b = t.querySelector('button.toggle');
      b.addEventListener('click', function(){
        buildTokens(t); t.classList.toggle('show-tokens');
        b.textContent = t.classList.contains('show-tokens') ? 'turn view' : 'token view';
      });
      Array.prototype.forEach.call($('tlist').children, function(tr){
        tr.classList.toggle('open', tr.dataset.id === id);
      });
    });
  }
  function poll(){
    var jobs = state.map(function(st, i){
      return get('api/metrics?run=' + i + '&since=' + st.rows.length + '&epoch=' + st.epoch).then(function(d){
        if (d.reset) st.rows = [];
        st.rows = st.rows.concat((d.rows || []).map(asRow)); st.epoch = d.epoch;
        st.bad = d.bad_lines || 0; st.badNotes = d.bad_line_notes || [];
      });
    });
    if (polls % 5 === 0) {
      jobs.push(get('api/runs').then(function(rs){ rs.forEach(function(r, i){ runs[i] = r; }); }));
      state.forEach(function(st, i){
        jobs.push(get('api/tool_latencies?run=' + i).then(function(d){ st.latencies = d; }));
      });
    }
    Promise.all(jobs).then(function(){ render(); return listTranscripts(); })
      .then(function(){ $('error').textContent = ''; })
      .catch(function(e){ $('error').textContent = 'poll failed: ' + e; })
      .then(function(){ polls++; window.rlfactoryDashboard.polls = polls; setTimeout(poll, POLL_MS); });
  }
  ['f-run', 'f-finish', 'f-rmin', 'f-rmax', 'f-toolerr'].forEach(function(id){
    $(id).addEventListener('input', listTranscripts); $(id).addEventListener('change', listTranscripts);
  });
  window.rlfactoryDashboard = {polls: 0, open: openTranscript,
    points: function(id){ var c = $('c-' + id); return c ? parseInt(c.dataset.points, 10) : 0; },
    badLines: function(i){ return state[i] ? state[i].bad : 0; }};
  get('api/runs').then(function(rs){
    runs = rs; state = rs.map(function(){ return {rows: [], epoch: null, latencies: {}, bad: 0, badNotes: []}; });
    poll();
  });
})();
"""


_TOOL_TABLE = (
    '<table id="tool-table"><thead><tr><th>run</th><th>tool</th><th>calls</th><th>errors</th><th>error rate</th>'
    '<th>p50 ms</th><th>p90 ms</th><th>max ms</th><th>sampled calls</th></tr></thead>'
    '<tbody id="tool-rows"></tbody></table>')


def render_page(title: str = "rlfactory dashboard") -> str:
    """The dashboard page: sections for learning curves, tools, rollout shape, stage times, staleness, transcripts."""
    t = html.escape(title)
    parts = []
    for sec in SECTIONS:
        hidden = ' class="hidden-section"' if sec.get("only_if") else ""
        parts.append(f'<div id="{sec["id"]}-section"{hidden}><h2>{html.escape(sec["title"])}</h2>'
                     f'<div class="grid" id="{sec["id"]}"></div>')
        if sec["id"] == "tools":
            parts.append(_TOOL_TABLE)
        parts.append("</div>")
    sections = "".join(parts)
    spec = json.dumps({"sections": SECTIONS, "zero": ZERO_WHEN_ABSENT, "meanings": chart_meanings()}
                      ).replace("<", "\\u003c")
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{t}</title><style>{VIEWER_CSS}{_CSS}</style></head><body>"
        f'<header><h1>{t}</h1><div id="runs"></div><div id="notes"></div><div id="error"></div></header>'
        '<main class="dash">'
        f"{sections}"
        '<h2>Newest transcripts</h2><div id="filters">'
        '<label>run <select id="f-run"></select></label>'
        '<label>finish <select id="f-finish"><option value="">all</option></select></label>'
        '<label>reward ≥ <input id="f-rmin" type="number" step="any" size="5"></label>'
        '<label>reward ≤ <input id="f-rmax" type="number" step="any" size="5"></label>'
        '<label><input id="f-toolerr" type="checkbox"> with a tool error</label><span id="tcount"></span></div>'
        '<table><thead><tr><th>step</th><th>trajectory</th><th>reward</th><th>finish</th><th>turns</th>'
        '<th>tokens</th><th>tool calls</th><th>tool errors</th><th>images</th><th>tree</th></tr></thead>'
        '<tbody id="tlist"></tbody>'
        '</table>'
        f'<div id="viewer"></div></main><script type="application/json" id="chart-spec">{spec}</script>'
        f"<script>{_JS}</script></body></html>"
    )
