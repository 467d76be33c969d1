/**
 * The operations page's stylesheet: system fonts, one accent per lifecycle, light and dark
 * by `prefers-color-scheme`. Inline in the page (no CDN, no build step); the handler's
 * Content-Security-Policy allows exactly this text by its hash.
 */
export const PAGE_STYLE = `
:root {
  color-scheme: light dark;
  --bg: #f6f7f9; --card: #ffffff; --text: #1b1f24; --muted: #5d6773; --border: #dde1e6;
  --code: #f0f2f5; --accent: #2f6fde;
  --live: #1a7f4b; --live-bg: #e3f5ea; --busy: #1f62c9; --busy-bg: #e4eefc;
  --wait: #6b7480; --wait-bg: #eceef1; --catch: #8a5a00; --catch-bg: #fbf0d9;
  --bad: #b3261e; --bad-bg: #fce8e6; --warn: #8a5a00; --warn-bg: #fff4dc;
}
@media (prefers-color-scheme: dark) {
  :root {
    --bg: #111418; --card: #1a1f25; --text: #e6e9ed; --muted: #9aa4af; --border: #2c333b;
    --code: #232a31; --accent: #6ea0ff;
    --live: #5fd394; --live-bg: #16311f; --busy: #7fb0ff; --busy-bg: #172640;
    --wait: #a3acb6; --wait-bg: #262c33; --catch: #f0c060; --catch-bg: #3a2e12;
    --bad: #ff8a80; --bad-bg: #3d1a18; --warn: #f0c060; --warn-bg: #3a2e12;
  }
}
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--text);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px; }
header { position: sticky; top: 0; z-index: 1; background: var(--card);
  border-bottom: 1px solid var(--border); padding: 12px 24px;
  display: flex; flex-wrap: wrap; gap: 8px 20px; align-items: center; }
header h1 { font-size: 17px; margin: 0; font-weight: 650; }
header .instance { color: var(--muted); }
header .spacer { flex: 1; }
main { max-width: 1180px; margin: 0 auto; padding: 20px 24px 48px; }
.summary { display: flex; flex-wrap: wrap; gap: 10px; margin-bottom: 18px; }
.stat { background: var(--card); border: 1px solid var(--border); border-radius: 8px;
  padding: 8px 14px; min-width: 110px; }
.stat b { display: block; font-size: 20px; line-height: 1.2; }
.stat span { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.pill { display: inline-block; border-radius: 999px; padding: 1px 10px; font-size: 12.5px;
  font-weight: 600; white-space: nowrap; background: var(--wait-bg); color: var(--wait); }
.pill.live { background: var(--live-bg); color: var(--live); }
.pill.backfilling { background: var(--busy-bg); color: var(--busy); }
.pill.catching_up { background: var(--catch-bg); color: var(--catch); }
.pill.paused, .pill.bad { background: var(--bad-bg); color: var(--bad); }
.pill.ok { background: var(--live-bg); color: var(--live); }
.card { background: var(--card); border: 1px solid var(--border); border-radius: 10px;
  margin-bottom: 14px; overflow: hidden; }
.card.paused { border-left: 4px solid var(--bad); }
.card.backfilling, .card.waiting_to_backfill { border-left: 4px solid var(--busy); }
.card.catching_up { border-left: 4px solid var(--catch); }
.card.live { border-left: 4px solid var(--live); }
.card-head { display: flex; flex-wrap: wrap; gap: 8px 14px; align-items: center; padding: 12px 16px; }
.card-head h2 { margin: 0; font-size: 16px; font-weight: 650; word-break: break-all; }
.card-head .facts { color: var(--muted); display: flex; gap: 14px; flex-wrap: wrap; }
.card-head .buttons { margin-left: auto; display: flex; gap: 6px; }
.statement { display: block; margin: 0 16px 12px; padding: 8px 10px; background: var(--code); border-radius: 6px;
  white-space: pre-wrap; word-break: break-word; color: var(--muted); }
.progress { margin: 0 16px 12px; }
.bar { height: 8px; border-radius: 4px; background: var(--code); overflow: hidden; }
.bar > span { display: block; height: 100%; background: var(--busy); transition: width .4s ease; }
.bar.unknown > span { width: 30%; opacity: .5; }
.progress .label { color: var(--muted); font-size: 12.5px; margin-top: 3px; }
.charts { display: flex; flex-wrap: wrap; gap: 8px 28px; margin: 0 16px 12px; }
.chart { display: flex; align-items: center; gap: 10px; }
.chart svg { width: 240px; height: 36px; display: block; background: var(--code); border-radius: 4px; }
.chart polyline { fill: none; stroke: var(--accent); stroke-width: 1.5; stroke-linejoin: round; }
.chart polygon { fill: var(--accent); opacity: .14; stroke: none; }
.chart circle { fill: var(--accent); }
.chart.lag polyline { stroke: var(--catch); }
.chart.lag polygon, .chart.lag circle { fill: var(--catch); }
.chart .label { font-size: 12.5px; color: var(--muted); min-width: 170px; }
.chart .label b { color: var(--text); font-weight: 600; }
.trend.growing { color: var(--bad); font-weight: 600; }
.trend.draining { color: var(--live); font-weight: 600; }
section { border-top: 1px solid var(--border); padding: 10px 16px; }
section h3 { margin: 0 0 6px; font-size: 12px; text-transform: uppercase; letter-spacing: .05em; color: var(--muted); }
section.bad h3 { color: var(--bad); }
section.warn h3 { color: var(--warn); }
.alert { background: var(--bad-bg); color: var(--text); border-radius: 6px; padding: 6px 10px; margin: 4px 0; }
.alert.warn { background: var(--warn-bg); }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 4px 8px 4px 0; vertical-align: top; border-bottom: 1px solid var(--border); }
th { font-weight: 600; color: var(--muted); font-size: 12px; }
td.err { color: var(--bad); }
tr:last-child td { border-bottom: 0; }
button { font: inherit; font-size: 12.5px; border-radius: 6px; padding: 3px 11px; cursor: pointer;
  border: 1px solid var(--border); background: var(--card); color: var(--text); }
button:hover { border-color: var(--accent); color: var(--accent); }
button:disabled { opacity: .5; cursor: default; }
button.danger:hover { border-color: var(--bad); color: var(--bad); }
.muted { color: var(--muted); }
.empty { color: var(--muted); padding: 40px; text-align: center; background: var(--card);
  border: 1px dashed var(--border); border-radius: 10px; }
#banner { display: none; margin-bottom: 14px; }
#banner.show { display: block; }
#toast { position: fixed; right: 20px; bottom: 20px; max-width: 460px; padding: 10px 14px;
  border-radius: 8px; background: var(--text); color: var(--bg); box-shadow: 0 4px 16px rgba(0,0,0,.25);
  opacity: 0; transition: opacity .2s; pointer-events: none; }
#toast.show { opacity: 1; }
#toast.bad { background: var(--bad); color: #fff; }
`;
