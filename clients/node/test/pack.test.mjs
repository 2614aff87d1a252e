// The packed tarball installs into a fresh folder without the network
// (from npm's cache) and imports, with its declarations.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

import { PACKAGE_DIR } from './helpers.mjs';

function run(cmd, args, cwd) {
  const out = spawnSync(cmd, args, { cwd, encoding: 'utf8', env: { ...process.env, npm_config_audit: 'false', npm_config_fund: 'false' } });
  assert.equal(out.status, 0, `${cmd} ${args.join(' ')} exited ${out.status}\n${out.stdout}\n${out.stderr}`);
  return out.stdout;
}

test('npm pack, then npm install --offline of the tarball, then import("seatgate")', () => {
  const dir = mkdtempSync(join(tmpdir(), 'seatgate-node-pack-'));
  try {
    const packed = JSON.parse(run('npm', ['pack', '--json', '--pack-destination', dir], PACKAGE_DIR));
    const tarball = packed[0].filename;
    assert.equal(tarball, 'seatgate-0.1.0.tgz');
    const files = packed[0].files.map((f) => f.path);
    assert.ok(files.includes('dist/index.js') && files.includes('dist/index.d.ts') && files.includes('README.md'), files.join(' '));
    assert.ok(!files.some((f) => f.startsWith('src/') || f.startsWith('test/') || f.startsWith('node_modules/')), files.join(' '));
    const app = join(dir, 'app');
    run('mkdir', ['-p', app], dir);
    writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'app', version: '1.0.0', private: true, type: 'module' }));
    run('npm', ['install', '--offline', '--no-audit', '--no-fund', join(dir, tarball)], app);
    const installed = JSON.parse(readFileSync(join(app, 'node_modules/seatgate/package.json'), 'utf8'));
    assert.equal(installed.version, '0.1.0');
    assert.ok(existsSync(join(app, 'node_modules/ioredis')));
    const printed = run(process.execPath, ['-e', "import('seatgate').then((m) => console.log(Object.keys(m).sort().join(',')))"], app);
    assert.equal(printed.trim(), 'Client,Seat,SeatgateError,crc32');
    // The declarations resolve through the exports map, under --strict.
    writeFileSync(
      join(app, 'use.ts'),
      [
        "import { Client, SeatgateError, type Seat, type ReleaseResult } from 'seatgate';",
        'export async function use(): Promise<ReleaseResult> {',
        "  const client = await Client.connect({ url: 'redis://127.0.0.1:1', application: 'cad' });",
        "  const seat: Seat = await client.acquireSeat('cad-pro', { user: 'ada', waitMs: 1000 });",
        "  seat.on('lost', (loss) => console.log(loss.status.toLowerCase()));",
        '  const e: SeatgateError | undefined = undefined; void e;',
        '  return seat.release();',
        '}',
      ].join('\n'),
    );
    run(
      process.execPath,
      [join(PACKAGE_DIR, 'node_modules/typescript/bin/tsc'), '--noEmit', '--strict', '--module', 'nodenext', '--moduleResolution', 'nodenext', '--target', 'es2022', '--lib', 'es2022,esnext.disposable', '--types', 'node', '--typeRoots', join(PACKAGE_DIR, 'node_modules/@types'), 'use.ts'],
      app,
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
