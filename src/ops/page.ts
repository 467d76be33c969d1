import { createHash } from 'node:crypto';
import { PAGE_SCRIPT } from './page-script.js';
import { PAGE_STYLE } from './page-style.js';

/**
 * The operations page: one self-contained HTML document (style and script inline, nothing
 * fetched from elsewhere). Its data arrives by polling `snapshot.json`; the HTML itself
 * holds no value from the database, only the app-given title, escaped here.
 */

const ESCAPES: Record<string, string> = {
  '&': '&amp;',
  '<': '&lt;',
  '>': '&gt;',
  '"': '&quot;',
  "'": '&#39;',
};

export function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => ESCAPES[c]!);
}

function sha256(text: string): string {
  return `'sha256-${createHash('sha256').update(text).digest('base64')}'`;
}

/**
 * The page's Content-Security-Policy: its own inline style and script by hash, requests
 * only to its own origin, no frames, no forms, no plugins. A value that slipped into the
 * HTML unescaped could still not run.
 */
export const PAGE_CSP = [
  "default-src 'none'",
  `script-src ${sha256(PAGE_SCRIPT)}`,
  `style-src ${sha256(PAGE_STYLE)}`,
  "connect-src 'self'",
  "img-src 'self' data:",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'self'",
].join('; ');

/**
 * The page, titled `title`, polling its snapshot every `pollMs` and the last hour of each
 * transform (its charts) every `historyMs`.
 */
export function renderPage(title: string, pollMs: number, historyMs = 10_000): string {
  const t = escapeHtml(title);
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light dark">
<link rel="icon" href="data:,">
<title>${t}</title>
<style>${PAGE_STYLE}</style>
</head>
<body data-poll-ms="${Math.max(250, Math.floor(pollMs))}" data-history-ms="${Math.max(1000, Math.floor(historyMs))}">
<header>
  <h1>${t}</h1>
  <span class="instance" id="instance"></span>
  <span id="workers"></span>
  <span class="spacer"></span>
  <span class="muted" id="updated">loading…</span>
</header>
<main>
  <div id="banner" role="alert"></div>
  <div class="summary" id="summary"></div>
  <div id="transforms"></div>
</main>
<div id="toast" role="status" aria-live="polite"></div>
<script>${PAGE_SCRIPT}</script>
</body>
</html>
`;
}
