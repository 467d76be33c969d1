/**
 * The operations page's script: polls `snapshot.json` beside the page and redraws. Every
 * value from the database goes into the page as a text node (`h()` below), never as HTML,
 * so a target named `<script>` shows as those characters. Actions post JSON to
 * `actions/<name>` with a header a cross-site form cannot send. Plain ES2017, no build.
 */
export const PAGE_SCRIPT = String.raw`
(function () {
  'use strict';
  var path = location.pathname;
  var base = path.charAt(path.length - 1) === '/' ? path : path + '/';
  var pollMs = Number(document.body.getAttribute('data-poll-ms')) || 1000;
  var main = document.getElementById('transforms');
  var summary = document.getElementById('summary');
  var banner = document.getElementById('banner');
  var toast = document.getElementById('toast');
  var historyMs = Number(document.body.getAttribute('data-history-ms')) || 10000;
  var pending = {};
  var last = null;
  // The last hour of each transform, by target (history.json): what the charts draw.
  var history = null;
  var HOUR_MS = 3600 * 1000;

  // Element with attributes and children; strings and numbers become text nodes.
  function h(tag, attrs) {
    var el = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        var v = attrs[k];
        if (v === undefined || v === null || v === false) return;
        if (k === 'onclick') el.addEventListener('click', v);
        else el.setAttribute(k, String(v));
      });
    }
    for (var i = 2; i < arguments.length; i++) add(el, arguments[i]);
    return el;
  }
  function add(el, child) {
    if (child === undefined || child === null || child === false) return;
    if (Array.isArray(child)) { child.forEach(function (c) { add(el, c); }); return; }
    el.appendChild(typeof child === 'object' ? child : document.createTextNode(String(child)));
  }

  function num(n) { return Number(n).toLocaleString('en-US'); }
  function ago(iso) {
    if (!iso) return '';
    var s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
    if (s < 60) return s + ' s ago';
    if (s < 3600) return Math.floor(s / 60) + ' min ago';
    if (s < 86400) return Math.floor(s / 3600) + ' h ago';
    return Math.floor(s / 86400) + ' d ago';
  }
  function when(iso) { return iso ? h('span', { title: iso }, ago(iso)) : '-'; }
  function lagText(lag) {
    if (lag.segments === 0 && lag.seconds === 0) return 'caught up';
    return num(lag.segments) + ' segment' + (lag.segments === 1 ? '' : 's') + ', ' +
      Math.round(lag.seconds) + ' s behind';
  }
  function duration(seconds) {
    var s = Math.max(0, Math.round(seconds));
    if (s < 60) return s + ' s';
    var m = Math.round(s / 60);
    if (m < 60) return m + ' min';
    return Math.floor(m / 60) + ' h' + (m % 60 ? ' ' + (m % 60) + ' min' : '');
  }
  function short(n) {
    if (n >= 100) return num(Math.round(n));
    if (n >= 10) return n.toFixed(1);
    return String(Math.round(n * 100) / 100);
  }
  function allowed(name) { return last && last.actions.indexOf(name) >= 0; }

  function showToast(text, bad) {
    toast.textContent = text;
    toast.className = 'show' + (bad ? ' bad' : '');
    clearTimeout(showToast.timer);
    showToast.timer = setTimeout(function () { toast.className = ''; }, 5000);
  }

  function act(name, body, label) {
    var id = name + ':' + JSON.stringify(body);
    if (pending[id]) return;
    pending[id] = true;
    render();
    fetch(base + 'actions/' + name, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-trellis-ops': '1' },
      body: JSON.stringify(body),
    }).then(function (res) {
      return res.json().then(function (data) {
        if (!res.ok) throw new Error((data && data.error && data.error.message) || res.statusText);
        return data;
      });
    }).then(function (data) {
      var r = data.result || {};
      if (name === 'release' && r.released === false) showToast('Held again: ' + r.error, true);
      else showToast(label + ': done');
    }, function (err) {
      showToast(label + ' failed: ' + err.message, true);
    }).then(function () {
      delete pending[id];
      refresh();
    });
  }
  function button(name, body, text, label, cls) {
    if (!allowed(name)) return null;
    var id = name + ':' + JSON.stringify(body);
    return h('button', {
      type: 'button', 'class': cls, 'data-action': name, disabled: pending[id] ? 'disabled' : null,
      onclick: function () { act(name, body, label); },
    }, pending[id] ? text + '…' : text);
  }

  function table(headers, rows) {
    return h('table', null,
      h('thead', null, h('tr', null, headers.map(function (x) { return h('th', null, x); }))),
      h('tbody', null, rows));
  }

  // The whole transform's Resume is in the card's head; here, why, and each paused column.
  function pausesSection(t) {
    var s = t.status;
    if (s.status !== 'paused' && s.pausedColumns.length === 0 && s.pausedUpstreamColumns.length === 0) return null;
    return h('section', { 'class': 'bad', 'data-section': 'pauses' }, h('h3', null, 'Paused'),
      s.status === 'paused' ? h('div', null, 'Transform paused: ', h('b', { 'data-role': 'pause-reason' }, s.pauseReason || 'unknown reason')) : null,
      s.pausedColumns.map(function (a) {
        var column = a.slice(t.target.length + 1);
        return h('div', null, 'Column ', h('code', null, a), ' paused ',
          button('resume', { target: t.target, column: column }, 'Resume column', 'Resume ' + a));
      }),
      s.pausedUpstreamColumns.length ? h('div', { 'class': 'muted' },
        'Reads paused upstream columns: ', s.pausedUpstreamColumns.join(', ')) : null);
  }

  function failuresSection(t) {
    var s = t.status, items = [];
    if (s.captureFailure) items.push(h('div', { 'class': 'alert' }, h('b', null, 'Capture ' + s.captureFailure.kind + ': '),
      s.captureFailure.error, s.captureFailure.columns.length ? ' (columns: ' + s.captureFailure.columns.join(', ') + ')' : '',
      ' · ', when(s.captureFailure.detectedAt)));
    if (s.buildFailure) items.push(h('div', { 'class': 'alert' }, h('b', null, 'Build failed ' + s.buildFailure.attempts + ' time(s): '),
      s.buildFailure.error, ' · next attempt ', s.buildFailure.nextAttemptAt));
    if (s.drainFailure) items.push(h('div', { 'class': 'alert' }, h('b', null, 'Drain page ' + s.drainFailure.segSeq + ' failing (' + s.drainFailure.attempts + ' attempts): '),
      s.drainFailure.error, s.drainFailure.sqlstate ? ' [' + s.drainFailure.sqlstate + ']' : '', ' · since ', when(s.drainFailure.since)));
    if (items.length === 0) return null;
    return h('section', { 'class': 'bad', 'data-section': 'failures' }, h('h3', null, 'Failures'), items);
  }

  function waitSection(t) {
    var w = t.status.captureWait;
    // What a transform that is not live waits on (status().waitingOn, ADR 0038).
    if (!w && t.status.waitingOn && t.status.status !== 'live') {
      return h('section', { 'class': 'muted', 'data-section': 'waiting-on' },
        'Waiting on ', h('b', null, t.status.waitingOn.kind.replace('_', ' ')), ': ', t.status.waitingOn.reason);
    }
    if (!w) return null;
    var rows = w.blockers.map(function (b) {
      return h('tr', null, h('td', { 'class': 'mono' }, b.pid), h('td', null, b.applicationName || '-'),
        h('td', null, b.state || '-'), h('td', null, when(b.xactStart)), h('td', { 'class': 'mono' }, b.query));
    }).concat(w.prepared.map(function (p) {
      return h('tr', null, h('td', { 'class': 'mono' }, 'prepared ' + p.gid), h('td', null, p.owner),
        h('td', null, 'prepared'), h('td', null, when(p.prepared)), h('td', { 'class': 'mono' }, 'COMMIT PREPARED / ROLLBACK PREPARED ' + p.gid));
    }));
    return h('section', { 'class': 'warn', 'data-section': 'capture-wait' }, h('h3', null, 'Capture waits'),
      h('div', null, h('b', null, w.operation), ' on ', h('code', null, w.table), ' needs ', h('code', null, w.lockMode),
        ' · since ', when(w.since), w.attempts === null ? '' : ' · ' + w.attempts + ' tries'),
      rows.length ? table(['blocker', 'application', 'state', 'transaction began', 'query'], rows)
        : h('div', { 'class': 'muted' }, 'No blocking session right now.'));
  }

  function gapsSection(t) {
    var gaps = t.status.sourceIndexGaps;
    if (gaps.length === 0) return null;
    return h('section', { 'class': 'warn', 'data-section': 'index-gaps' }, h('h3', null, 'Source index gaps'),
      table(['table', 'columns', 'role', 'in a migration', 'from psql'], gaps.map(function (g) {
        return h('tr', null, h('td', { 'class': 'mono' }, g.table), h('td', { 'class': 'mono' }, g.columns.join(', ')),
          h('td', null, g.role + (g.optedOut ? ' (opted out)' : '')),
          h('td', null, h('code', { 'data-role': 'fix-in-migration' }, g.fixInMigration)),
          h('td', null, h('code', { 'data-role': 'fix' }, g.fix)));
      })));
  }

  function correctingSection(t) {
    var c = t.status.correcting;
    if (c.length === 0) return null;
    return h('section', { 'class': 'warn', 'data-section': 'correcting' }, h('h3', null, 'Correcting partitions'),
      c.map(function (n) {
        return h('div', null, h('code', null, n.node), ' since ', when(n.since), ' · ',
          n.keysRemaining === null ? 'counting keys' : num(n.keysRemaining) + ' keys remaining');
      }));
  }

  function heldSection(t) {
    if (t.held.length === 0) return null;
    return h('section', { 'class': 'bad', 'data-section': 'held' }, h('h3', null, 'Held keys'),
      t.held.map(function (a) {
        var more = a.count - a.samples.length;
        return h('div', null,
          h('div', null, h('code', null, a.address), ' holds ', h('b', null, num(a.count)), ' key' + (a.count === 1 ? '' : 's'),
            a.paused ? ' (paused)' : '', ' · oldest ', when(a.oldestPoisonedAt)),
          table(['source table', 'key', 'error', 'held', ''], a.samples.map(function (k) {
            return h('tr', null, h('td', { 'class': 'mono' }, k.srcTable), h('td', { 'class': 'mono' }, k.key),
              h('td', { 'class': 'err' }, k.error, k.sqlstate ? ' [' + k.sqlstate + ']' : ''), h('td', null, when(k.poisonedAt)),
              h('td', null, button('release', { target: t.target, address: a.address, srcTable: k.srcTable, key: k.key },
                'Release', 'Release ' + k.key)));
          })),
          more > 0 ? h('div', { 'class': 'muted' }, 'and ' + num(more) + ' more (trellis quarantine ' + a.address + ')') : null);
      }));
  }

  function checkSection(t) {
    var j = t.selfCheck;
    if (!j && !allowed('selfCheck')) return null;
    var line = null;
    if (j) {
      var r = j.report;
      var state = j.state === 'done' && r ? r.outcome : j.state;
      var cls = state === 'consistent' ? 'ok' : state === 'diverged' || state === 'failed' ? 'bad' : '';
      line = h('div', null, h('span', { 'class': 'pill ' + cls, 'data-check-state': state }, state), ' ',
        j.mode + ' check, ', num(j.rowsCompared), j.rowsTotal === null ? '' : ' of ' + num(j.rowsTotal), ' keys compared',
        r ? ' · missing ' + r.counts.missing + ', extra ' + r.counts.extra + ', differing ' + r.counts.differs : '',
        j.error ? h('span', { 'class': 'err' }, ' · ' + j.error) : '',
        ' · ', when(j.finishedAt || j.startedAt || j.createdAt));
    }
    return h('section', { 'data-section': 'self-check' }, h('h3', null, 'Self-check'),
      line || h('div', { 'class': 'muted' }, 'Not checked yet.'));
  }

  // SVG elements (attributes only, never markup).
  var SVG_NS = 'http://www.w3.org/2000/svg';
  function svg(tag, attrs) {
    var el = document.createElementNS(SVG_NS, tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (attrs[k] !== null && attrs[k] !== undefined) el.setAttribute(k, String(attrs[k]));
    });
    return el;
  }

  // A sparkline of the last hour (right edge: now), drawn from the engine's samples.
  function chart(kind, name, samples, value, unit) {
    var W = 240, H = 36, end = Date.now(), start = end - HOUR_MS;
    var pts = samples.filter(function (x) { return value(x) !== null; });
    var max = pts.reduce(function (m, x) { return Math.max(m, value(x)); }, 0);
    var top = max > 0 ? max : 1;
    var xy = pts.map(function (x) {
      var px = Math.min(W, Math.max(0, (Date.parse(x.at) - start) / HOUR_MS * W));
      var py = H - 2 - (value(x) / top) * (H - 4);
      return [px.toFixed(1), py.toFixed(1)];
    });
    var lastPoint = pts.length ? pts[pts.length - 1] : null;
    var el = svg('svg', {
      viewBox: '0 0 ' + W + ' ' + H, preserveAspectRatio: 'none', role: 'img',
      'aria-label': name + ' over the last hour', 'data-chart': kind, 'data-points': pts.length,
      'data-last-at': lastPoint ? lastPoint.at : null, 'data-last-value': lastPoint ? value(lastPoint) : null,
      // Which samples the points are, for whoever checks them against the catalog.
      'data-times': pts.map(function (x) { return x.at; }).join(' '),
    });
    if (xy.length > 0) {
      var line = xy.map(function (p) { return p.join(','); }).join(' ');
      el.appendChild(svg('polygon', { points: xy[0][0] + ',' + H + ' ' + line + ' ' + xy[xy.length - 1][0] + ',' + H }));
      el.appendChild(svg('polyline', { points: line }));
      el.appendChild(svg('circle', { cx: xy[xy.length - 1][0], cy: xy[xy.length - 1][1], r: 2.5 }));
    }
    var title = svg('title');
    title.textContent = name + ', last hour: ' + pts.length + ' samples, max ' + short(max) + ' ' + unit;
    el.appendChild(title);
    return h('div', { 'class': 'chart ' + kind }, el, h('div', { 'class': 'label' },
      name, ' ', h('b', { 'data-role': kind + '-now' }, lastPoint ? short(value(lastPoint)) + ' ' + unit : '-'),
      h('br'), 'max ' + short(max) + ' ' + unit + ' in the hour'));
  }

  // Whether lag grows or drains: the last sample against the one about a minute before.
  function trend(samples) {
    if (samples.length < 2) return null;
    var lastS = samples[samples.length - 1];
    var then = Date.parse(lastS.at) - 60000, before = samples[0];
    samples.forEach(function (x) { if (Date.parse(x.at) <= then) before = x; });
    var d = lastS.lagSeconds - before.lagSeconds;
    if (lastS.lagSeconds < 1 && before.lagSeconds < 1) return ['steady', 'caught up'];
    if (d > 1) return ['growing', 'lag growing'];
    if (d < -1) return ['draining', 'lag draining'];
    return ['steady', 'lag steady'];
  }

  function charts(t) {
    if (!history) return null;
    var samples = history[t.target] || [];
    if (samples.length === 0) {
      return h('div', { 'class': 'charts muted', 'data-section': 'charts' },
        'No samples yet: the staging worker takes one every 10 s.');
    }
    var tr = trend(samples);
    return h('div', { 'class': 'charts', 'data-section': 'charts' },
      chart('lag', 'lag', samples, function (x) { return x.lagSeconds; }, 's'),
      chart('keys', 'changed keys', samples, function (x) { return x.keysPerSecond; }, 'keys/s'),
      tr ? h('span', { 'class': 'trend ' + tr[0], 'data-role': 'trend' }, tr[1]) : null);
  }

  function progress(t) {
    var p = t.progress;
    if (!p) return null;
    var bar = h('div', { 'class': 'bar' + (p.fraction === null ? ' unknown' : ''), role: 'progressbar',
      'aria-valuemin': 0, 'aria-valuemax': 100, 'aria-valuenow': p.fraction === null ? null : Math.floor(p.fraction * 100) }, h('span'));
    if (p.fraction !== null) bar.firstChild.style.width = (p.fraction * 100).toFixed(1) + '%';
    return h('div', { 'class': 'progress' }, bar, h('div', { 'class': 'label' },
      (p.fraction === null ? '' : Math.floor(p.fraction * 100) + '% · ') + num(p.done) + ' of ' +
      (p.total === null ? '?' : num(p.total)) + ' keys backfilled',
      p.rate === null ? null : h('span', { 'data-role': 'pace' }, ' · ' + num(Math.round(p.rate)) + ' keys/s' +
        (p.etaSeconds === null ? '' : ', about ' + duration(p.etaSeconds) + ' left'))));
  }

  function card(t) {
    var s = t.status;
    var paused = s.status === 'paused';
    var held = s.heldKeys;
    return h('article', { 'class': 'card ' + s.status, 'data-target': t.target, 'data-lifecycle': s.status },
      h('div', { 'class': 'card-head' },
        h('h2', null, t.target),
        h('span', { 'class': 'pill ' + s.status, 'data-role': 'lifecycle' }, s.status.replace(/_/g, ' ')),
        h('span', { 'class': 'facts' },
          h('span', { 'data-role': 'lag' }, lagText(s.lag)),
          held > 0 ? h('span', null, num(held) + ' held key' + (held === 1 ? '' : 's')) : null),
        h('span', { 'class': 'buttons' },
          paused ? button('resume', { target: t.target }, 'Resume', 'Resume ' + t.target)
            : button('pause', { target: t.target }, 'Pause', 'Pause ' + t.target, 'danger'),
          button('selfCheck', { target: t.target }, 'Check', 'Self-check of ' + t.target))),
      progress(t),
      charts(t),
      h('code', { 'class': 'statement', title: 'statement' }, t.statement),
      pausesSection(t), failuresSection(t), waitSection(t), gapsSection(t), correctingSection(t),
      heldSection(t), checkSection(t));
  }

  function stat(value, label) { return h('div', { 'class': 'stat' }, h('b', null, value), h('span', null, label)); }

  function render() {
    if (!last) return;
    var ts = last.transforms;
    var count = function (f) { return ts.filter(f).length; };
    document.getElementById('instance').textContent = last.instance + ' → ' + last.targetSchema;
    var workers = document.getElementById('workers');
    var failure = ts.length ? ts[0].status.workerFailure : null;
    workers.replaceChildren.apply(workers, [
      h('span', { 'class': 'pill ' + (last.workers.staging ? 'ok' : 'bad') }, 'staging worker ' + (last.workers.staging ? 'running' : 'missing')),
      ' ',
      h('span', { 'class': 'pill ' + (last.workers.drain ? 'ok' : 'bad') }, 'drain ' + (last.workers.drain ? 'running' : 'missing')),
      ' ',
      // What stops the pipeline, the same in every status (workerFailure, ADR 0038).
      failure ? h('span', { 'class': 'pill bad', 'data-role': 'worker-failure' }, failure.error) : null,
      failure ? ' ' : null,
      h('span', { 'class': 'pill', 'data-role': 'mode' }, last.actions.length ? 'actions enabled' : 'read-only'),
    ].filter(function (x) { return x !== null; }));
    summary.replaceChildren(
      stat(ts.length, 'transforms'),
      stat(count(function (t) { return t.status.status === 'live'; }), 'live'),
      stat(count(function (t) { return ['waiting_to_backfill', 'backfilling', 'catching_up'].indexOf(t.status.status) >= 0; }), 'building'),
      stat(count(function (t) { return t.status.status === 'paused'; }), 'paused'),
      stat(num(ts.reduce(function (n, t) { return n + t.status.heldKeys; }, 0)), 'held keys'));
    main.replaceChildren.apply(main, ts.length ? ts.map(card)
      : [h('div', { 'class': 'empty' }, 'No transforms yet. Define one with apply(\'TRANSFORM …\').')]);
    document.getElementById('updated').textContent = 'updated ' + new Date(last.at).toLocaleTimeString();
  }

  function refresh() {
    clearTimeout(refresh.timer);
    fetch(base + 'snapshot.json', { headers: { accept: 'application/json' }, cache: 'no-store' })
      .then(function (res) {
        return res.json().then(function (data) {
          if (!res.ok) throw new Error((data && data.error && data.error.message) || res.statusText);
          return data;
        });
      })
      .then(function (data) {
        last = data;
        banner.className = '';
        render();
      }, function (err) {
        banner.className = 'alert show';
        banner.textContent = 'Could not read the status (' + err.message + '); retrying.';
      })
      .then(function () { refresh.timer = setTimeout(refresh, pollMs); });
  }
  function refreshHistory() {
    clearTimeout(refreshHistory.timer);
    fetch(base + 'history.json', { headers: { accept: 'application/json' }, cache: 'no-store' })
      .then(function (res) {
        if (!res.ok) throw new Error(res.statusText);
        return res.json();
      })
      .then(function (data) {
        var byTarget = {};
        data.transforms.forEach(function (x) { byTarget[x.target] = x.samples; });
        history = byTarget;
        render();
      }, function () { /* the snapshot's banner says when the page cannot read */ })
      .then(function () { refreshHistory.timer = setTimeout(refreshHistory, historyMs); });
  }
  refresh();
  refreshHistory();
})();
`;
