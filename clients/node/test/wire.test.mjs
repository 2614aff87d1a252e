// The pure parts: the shard of a license and the package's exports.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import * as seatgate from '../dist/index.js';

test('crc32 is zlib\'s: license acme goes to shard 2 of 4 (docs/protocol.md)', () => {
  assert.equal(seatgate.crc32('acme'), 0x05c4ba3e);
  assert.equal(seatgate.crc32('acme') % 4, 2);
  assert.equal(seatgate.crc32(''), 0);
});

test('the package exports Client, Seat and SeatgateError', () => {
  assert.equal(typeof seatgate.Client.connect, 'function');
  assert.equal(typeof seatgate.Client.gateway, 'function');
  assert.equal(typeof seatgate.Seat, 'function');
  const e = new seatgate.SeatgateError('TIMEOUT', 'no answer\nfrom anyone');
  assert.equal(e.code, 'TIMEOUT');
  assert.equal(e.message, 'no answer from anyone');
  assert.ok(e instanceof Error);
});
