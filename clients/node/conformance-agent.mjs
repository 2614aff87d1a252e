#!/usr/bin/env node
// The conformance agent (docs/testing.md, "The client conformance suite"): drives the
// package's seat handle from JSON lines on stdin and answers JSON lines on
// stdout, one object per line. Diagnostics go to stderr only.
//
//   node conformance-agent.mjs --redis <url> [--application <app>]
//   node conformance-agent.mjs --gateway <url> --token <bearer> [--ca <pem-file>]
//
// The Redis password, if any, comes from SEATGATE_REDIS_PASSWORD. Commands:
// {"cmd":"acquire","name":…,"license":…,"session"?,"user"?,"group"?,"priority"?,"borrow_ms"?,"wait_ms"?},
// {"cmd":"release","name":…}, {"cmd":"exit"}. Run `npm run build` first.

import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';

import { Client, SeatgateError } from './dist/index.js';

function say(obj) {
  process.stdout.write(`${JSON.stringify(obj)}\n`);
}

function diag(message) {
  process.stderr.write(`conformance-agent: ${message}\n`);
}

function parseArgs(argv) {
  const args = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (!a.startsWith('--')) throw new Error(`unexpected argument ${a}`);
    const value = argv[i + 1];
    if (value === undefined) throw new Error(`${a} needs a value`);
    args[a.slice(2)] = value;
    i++;
  }
  return args;
}

let args;
try {
  args = parseArgs(process.argv.slice(2));
  if (!args.redis === !args.gateway) throw new Error('give --redis <url> or --gateway <url> --token <bearer>');
  if (args.gateway && !args.token) throw new Error('--gateway needs --token');
} catch (e) {
  diag(e.message);
  process.exit(2);
}

const logger = (level, message) => {
  if (level !== 'debug') diag(`${level}: ${message}`);
};

let client;
try {
  client = args.redis
    ? await Client.connect({ url: args.redis, application: args.application, logger })
    : Client.gateway({ baseUrl: args.gateway, token: args.token, ca: args.ca ? readFileSync(args.ca) : undefined, logger });
} catch (e) {
  say({ event: 'error', error: e instanceof Error ? e.message : String(e) });
  process.exit(3);
}

/** name → { seat?, acquiring?: Promise } */
const handles = new Map();

function optionalInt(cmd, field) {
  const v = cmd[field];
  if (v === undefined || v === null) return undefined;
  if (!Number.isInteger(v) || v < 0) throw new Error(`${field} must be a whole number`);
  return v;
}

function acquire(cmd) {
  const { name, license } = cmd;
  if (typeof name !== 'string' || typeof license !== 'string') throw new Error('acquire needs "name" and "license"');
  if (handles.get(name)?.seat?.state === 'held') throw new Error(`handle ${name} already holds a seat`);
  const options = {
    session: cmd.session ?? undefined,
    user: cmd.user ?? undefined,
    group: cmd.group ?? undefined,
    priority: optionalInt(cmd, 'priority'),
    borrowMs: optionalInt(cmd, 'borrow_ms'),
    waitMs: optionalInt(cmd, 'wait_ms'),
    onQueued: (position) => say({ name, event: 'queued', position }),
  };
  const entry = { seat: undefined };
  handles.set(name, entry);
  entry.acquiring = client.acquireSeat(license, options).then(
    (seat) => {
      entry.seat = seat;
      say({ name, event: 'held', status: seat.grant.status, session: seat.session });
      seat.on('lost', (loss) => say({ name, event: 'lost', status: loss.status, reason: loss.error }));
    },
    (e) => {
      if (e instanceof SeatgateError && e.reply !== undefined && e.reply.status === e.code) {
        say({ name, event: 'refused', status: e.code, error: e.reply.error ?? '' });
      } else {
        say({ name, event: 'error', error: e instanceof Error ? e.message : String(e) });
      }
    },
  );
}

function release(cmd) {
  const { name } = cmd;
  const entry = handles.get(name);
  if (!entry) throw new Error(`no handle named ${JSON.stringify(name)}`);
  void (async () => {
    await entry.acquiring;
    if (!entry.seat) {
      say({ name, event: 'released', outcome: 'already_gone', status: '' });
      return;
    }
    const result = await entry.seat.release();
    say({ name, event: 'released', outcome: result.outcome, status: result.reply?.status ?? '' });
  })().catch((e) => say({ name, event: 'error', error: e instanceof Error ? e.message : String(e) }));
}

let exiting = false;
async function exit() {
  if (exiting) return;
  exiting = true;
  // Whatever happens, out within 2 s.
  setTimeout(() => {
    say({ event: 'exited' });
    process.exit(0);
  }, 1900).unref();
  try {
    await client.close();
  } catch (e) {
    diag(`close: ${e instanceof Error ? e.message : String(e)}`);
  }
  say({ event: 'exited' });
  process.exit(0);
}

const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
lines.on('line', (line) => {
  if (!line.trim()) return;
  let cmd;
  try {
    cmd = JSON.parse(line);
    if (cmd === null || typeof cmd !== 'object' || Array.isArray(cmd)) throw new Error('a command is a JSON object');
  } catch (e) {
    say({ event: 'error', error: `bad JSON: ${e.message}` });
    return;
  }
  try {
    switch (cmd.cmd) {
      case 'acquire':
        acquire(cmd);
        break;
      case 'release':
        release(cmd);
        break;
      case 'exit':
        void exit();
        break;
      default:
        say({ event: 'error', error: `unknown command ${JSON.stringify(cmd.cmd)}` });
    }
  } catch (e) {
    say({ ...(typeof cmd.name === 'string' ? { name: cmd.name } : {}), event: 'error', error: e.message });
  }
});
lines.on('close', () => void exit());

say({ event: 'ready' });
