// k6 load test of POST /seckill/{voucherId}, in two scenarios:
//
//   sale    a flash sale: every user of the token file tries once, all at
//           once, for one voucher with SALE_STOCK units. No 5xx is allowed;
//           200s and 409s are counted, and there may be no more 200s than
//           units (no oversell).
//   reject  meanwhile, the same users hammer a voucher created with stock 0
//           for REJECT_DURATION: every answer must be 409 sold_out (or
//           429 busy, for a user pressing faster than their rate).
//
// setup() logs the admin in (AUTH_DEV_CODES must be on) and creates both
// vouchers, so the only input is a file of user tokens, one per line, from
// loadtest/tokens:
//
//   go run ./loadtest/tokens -base http://127.0.0.1:8080 -n 2000 -out /tmp/tokens.txt
//   k6 run -e BASE=http://127.0.0.1:8080 -e TOKENS=/tmp/tokens.txt loadtest/seckill.js
//
// Options (-e NAME=value): BASE, TOKENS, ADMIN_PHONE (13800000000),
// SALE_STOCK (100), VUS (64), REJECT_DURATION (10s).

import http from 'k6/http';
import exec from 'k6/execution';
import { check, fail } from 'k6';
import { Counter } from 'k6/metrics';
import { SharedArray } from 'k6/data';

const BASE = __ENV.BASE || 'http://127.0.0.1:8080';
const ADMIN_PHONE = __ENV.ADMIN_PHONE || '13800000000';
const SALE_STOCK = parseInt(__ENV.SALE_STOCK || '100', 10);
const VUS = parseInt(__ENV.VUS || '64', 10);
const REJECT_DURATION = __ENV.REJECT_DURATION || '10s';

const tokens = new SharedArray('tokens', () => {
  if (!__ENV.TOKENS) {
    throw new Error('set -e TOKENS=<file of tokens, one per line> (see loadtest/tokens)');
  }
  return open(__ENV.TOKENS).split('\n').map((l) => l.trim()).filter((l) => l.length > 0);
});

const ordered = new Counter('seckill_200_ordered');
const conflict = new Counter('seckill_409');
const soldOut = new Counter('seckill_409_sold_out');
const alreadyOrdered = new Counter('seckill_409_already_ordered');
const busy = new Counter('seckill_429_busy');
const serverErrors = new Counter('seckill_5xx');
const unexpected = new Counter('seckill_unexpected');

export const options = {
  setupTimeout: '60s',
  scenarios: {
    sale: {
      executor: 'shared-iterations',
      exec: 'sale',
      vus: VUS,
      iterations: tokens.length,
      maxDuration: '2m',
    },
    reject: {
      executor: 'constant-vus',
      exec: 'reject',
      vus: VUS,
      duration: REJECT_DURATION,
      // Runs alongside the sale, as the crowd that keeps arriving for a
      // voucher that is already gone does.
    },
  },
  thresholds: {
    seckill_5xx: ['count==0'],
    seckill_unexpected: ['count==0'],
    [`seckill_200_ordered{scenario:sale}`]: [`count<=${SALE_STOCK}`],
    'checks{scenario:reject}': ['rate==1'],
  },
};

// 409 and 429 are answers the contract promises, not failures: keep them
// out of http_req_failed so that it counts only what went wrong.
http.setResponseCallback(http.expectedStatuses(200, 409, 429));

function post(path, body, token) {
  const headers = { 'Content-Type': 'application/json' };
  if (token) headers.Authorization = `Bearer ${token}`;
  return http.post(`${BASE}${path}`, body === null ? null : JSON.stringify(body), { headers });
}

export function setup() {
  const code = post('/auth/code', { phone: ADMIN_PHONE });
  if (code.status !== 200 || !code.json('code')) {
    fail(`POST /auth/code: ${code.status} ${code.body} (is AUTH_DEV_CODES on?)`);
  }
  const login = post('/auth/login', { phone: ADMIN_PHONE, code: code.json('code') });
  if (login.status !== 200) fail(`POST /auth/login: ${login.status} ${login.body}`);
  const admin = login.json('token');

  const begin = new Date(Date.now() - 60 * 1000).toISOString();
  const end = new Date(Date.now() + 6 * 3600 * 1000).toISOString();
  const create = (title, stock) => {
    const res = post('/vouchers', { title, stock, begin_time: begin, end_time: end }, admin);
    if (res.status !== 201) fail(`POST /vouchers: ${res.status} ${res.body}`);
    return res.json('id');
  };
  if (tokens.length <= SALE_STOCK) {
    console.warn(`only ${tokens.length} users for ${SALE_STOCK} units: the sale will not sell out`);
  }
  return { sale: create('k6 sale', SALE_STOCK), soldOut: create('k6 sold out', 0) };
}

// record counts one answer; it reports whether it was one the contract
// allows on this path.
function record(res) {
  if (res.status >= 500) serverErrors.add(1);
  switch (res.status) {
    case 200:
      ordered.add(1);
      return true;
    case 409: {
      conflict.add(1);
      const code = res.json('error.code');
      if (code === 'sold_out') soldOut.add(1);
      if (code === 'already_ordered') alreadyOrdered.add(1);
      return code === 'sold_out' || code === 'already_ordered';
    }
    case 429:
      busy.add(1);
      return true;
    default:
      unexpected.add(1);
      return false;
  }
}

export function sale(data) {
  // Each iteration is a different user: the whole crowd tries once.
  const token = tokens[exec.scenario.iterationInTest % tokens.length];
  const res = post(`/seckill/${data.sale}`, null, token);
  const ok = record(res);
  check(res, {
    'sale: no 5xx': (r) => r.status < 500,
    'sale: 200, 409 or 429': () => ok,
  });
}

export function reject(data) {
  const token = tokens[(exec.vu.idInTest * 7919 + exec.vu.iterationInScenario) % tokens.length];
  const res = post(`/seckill/${data.soldOut}`, null, token);
  record(res);
  // 429 is the contract's answer to a user pressing faster than their
  // rate (SECKILL_RATE), which a VU hammering the button may do.
  check(res, {
    'reject: 409 sold_out or 429 busy': (r) => (r.status === 409 && r.json('error.code') === 'sold_out') || r.status === 429,
  });
}
