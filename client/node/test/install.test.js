'use strict';
// The install line of the README and client/node/README.md works in a
// fresh project: `npm install --install-links <client/node>` copies the
// package with its dependencies (a plain `npm install <folder>` only links
// the folder, and require('pg-idem') then fails with "Cannot find module 'pg'").

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { execFileSync } = require('node:child_process');

const PACKAGE = path.resolve(__dirname, '..');

// Every `npm install ... client/node` the docs give, as written.
const ROOT = path.resolve(PACKAGE, '..', '..');
const DOCS = ['README.md', 'client/node/README.md', 'docs/guides/clients.md', 'docs/guides/http-frameworks.md',
  'docs/guides/connection-pooling.md'];
function documentedInstalls() {
  const found = new Set();
  for (const doc of DOCS) {
    const file = path.join(ROOT, doc);
    if (!fs.existsSync(file)) continue;
    for (const m of fs.readFileSync(file, 'utf8').matchAll(/npm\s+install((?:\s+--?[\w-]+)*)\s+\.\/client\/node/g)) found.add(m[1].trim().replace(/\s+/g, ' '));
  }
  return [...found];
}

test('the docs give an install line for client/node', () => {
  assert.ok(documentedInstalls().length > 0);
});

for (const flags of documentedInstalls()) {
  test(`npm install ${flags} ./client/node in a fresh project, as documented`, { timeout: 240000 }, () => {
    const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'pg_idem.install.'));
    // A fresh clone's client/node: the package's files, no node_modules.
    const clone = path.join(scratch, 'clone', 'client', 'node');
    fs.mkdirSync(clone, { recursive: true });
    for (const f of ['package.json', 'package-lock.json', 'index.js', 'lib', 'README.md']) {
      fs.cpSync(path.join(PACKAGE, f), path.join(clone, f), { recursive: true });
    }
    const project = path.join(scratch, 'app');
    fs.mkdirSync(project);
    try {
      fs.writeFileSync(path.join(project, 'package.json'), '{"name": "fresh-app", "version": "1.0.0", "private": true}\n');
      const args = ['install', ...flags.split(/\s+/).filter(Boolean), '--no-audit', '--no-fund', '--loglevel=error', clone];
      execFileSync('npm', args, { cwd: project, stdio: 'pipe' });
      const out = execFileSync('node', ['-e', "const idem = require('pg-idem'); console.log(idem.version)"],
        { cwd: project, encoding: 'utf8', stdio: 'pipe' });
      assert.equal(out.trim(), require('../package.json').version);
    } finally {
      fs.rmSync(scratch, { recursive: true, force: true });
    }
  });
}
