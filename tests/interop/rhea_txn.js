// A local transaction with rhea, which has no transaction API: this script attaches a coordinator link and sends the
// described Declare (0x31) and Discharge (0x32) values itself, and puts transactional-state (0x34) on its transfers
// (rhea's transfer frame has a `state` field it never fills: filled here) and on its consumer dispositions.
// usage: node rhea_txn.js commit|rollback HOST PORT IN OUT COUNT
//   declares a transaction; under it takes COUNT messages from IN (accepting each) and sends COUNT messages
//   "rhea-txn-0".. to OUT; then discharges (commit or rollback). Prints one JSON line:
//   {declared, sent: [outcome code per transfer], discharge: outcome code, condition}
// Any link or connection error prints it on stderr and exits 1.
'use strict';
const rhea = require('rhea');
const types = require('rhea/lib/types.js');
const frames = require('rhea/lib/frames.js');

const [mode, host, port, inAddr, outAddr, countText] = process.argv.slice(2);
const count = parseInt(countText, 10);
const container = rhea.create_container({ id: 'rhea-txn-' + mode });

function fail(what, error) {
  const cond = error && (error.condition || error.name);
  const desc = error && (error.description || error.message);
  process.stderr.write(`rhea txn ${mode}: ${what}: ${cond || ''} ${desc || ''}\n`);
  process.exit(1);
}

container.on('connection_error', (ctx) => fail('connection error', ctx.connection.error));
container.on('sender_error', (ctx) => fail('sender error', ctx.sender.error));
container.on('receiver_error', (ctx) => fail('receiver error', ctx.receiver.error));
container.on('error', (err) => fail('error', err));
container.on('disconnected', (ctx) => { if (ctx.error) fail('disconnected', ctx.error); });

// A transfer's delivery state, by delivery tag (hex): rhea writes transfers itself, this adds the state.
const transferStates = new Map();
types.wrap_delivery_state = (s) => s;
const transfer = frames.transfer;
frames.transfer = function (fields) {
  const state = transferStates.get(Buffer.from(fields.delivery_tag).toString('hex'));
  if (state) fields.state = state;
  return transfer(fields);
};

const list = (items) => types.wrap_list(items);
const described = (code, items) => types.described(types.wrap_ulong(code), list(items));
const OUTCOMES = { received: 0x23, accepted: 0x24, rejected: 0x25, released: 0x26, modified: 0x27 };
// rhea knows the outcomes of part 3 (composites); the others (declared, transactional-state) stay described values.
const code = (state) => {
  if (!state) return null;
  const known = state.constructor && state.constructor.composite_type;
  if (known) return OUTCOMES[known];
  return state.descriptor ? Number(types.unwrap(state.descriptor)) : null;
};
const txnState = (id, outcome) => described(0x34, outcome ? [types.wrap_binary(id), outcome] : [types.wrap_binary(id)]);

const conn = container.connect({ host, port: parseInt(port, 10), reconnect: false });
const coordinator = conn.open_sender({ name: 'txn-ctrl' });
coordinator.local.attach.target = described(0x30, []); // a coordinator target (attached on the next write)
const out = conn.open_sender(outAddr);
const result = { declared: false, sent: [], discharge: null, condition: null };
let txnId = null;
let declare = null;
let discharge = null;
let taken = 0;
let sentCount = 0;
let receiver = null;

// Control messages are encoded here (rhea's encoder would put its amqp-value descriptor over the value's own):
// an amqp-value section (0x77) holding Declare (0x31, empty list) or Discharge (0x32, [txn-id, fail]).
const DECLARE = Buffer.from('0053770053314' + '5', 'hex');
function dischargeBody(id, fail) {
  const fields = Buffer.concat([Buffer.from([0x02, 0xa0, id.length]), id, Buffer.from([fail ? 0x41 : 0x42])]);
  return Buffer.concat([Buffer.from('005377005332c0', 'hex'), Buffer.from([fields.length]), fields]);
}
let ctrlTags = 0;
function control(payload) {
  return coordinator.send(payload, Buffer.from('c' + ctrlTags++), 0); // format 0: the payload is sent as it is
}

coordinator.once('sendable', () => { declare = control(DECLARE); });

coordinator.on('settled', (ctx) => {
  const d = ctx.delivery;
  const state = d.remote_state;
  if (d === declare) {
    if (code(state) !== 0x33) fail('declare', { description: JSON.stringify(state) });
    txnId = types.unwrap(state.value[0]);
    result.declared = true;
    start();
  } else if (d === discharge) {
    result.discharge = code(state);
    const error = state && state.error;
    result.condition = error ? String(error.condition) : null;
    process.stdout.write(JSON.stringify(result) + '\n');
    conn.close();
  }
});

function start() {
  for (let i = 0; i < count; i++) {
    const tag = Buffer.from('t' + i);
    transferStates.set(tag.toString('hex'), txnState(txnId));
    out.send({ body: 'rhea-txn-' + i }, tag);
  }
  // Credit for COUNT messages once (no window refill): a roll back leaves the messages on the queue, not here.
  receiver = conn.open_receiver({ source: inAddr, credit_window: 0, autoaccept: false });
  receiver.add_credit(count);
}

out.on('settled', (ctx) => {
  result.sent.push(code(ctx.delivery.remote_state));
  sentCount++;
  maybeDischarge();
});

container.on('message', (ctx) => {
  // Accepted under the transaction (and settled: the transaction decides the message's fate).
  ctx.delivery.update(true, txnState(txnId, described(0x24, [])));
  taken++;
  maybeDischarge();
});

function maybeDischarge() {
  if (discharge === null && taken === count && sentCount === count) {
    discharge = control(dischargeBody(txnId, mode === 'rollback'));
  }
}
