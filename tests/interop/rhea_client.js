// Send or receive N messages through an AMQP 1.0 broker with rhea (a client not written here).
// usage: node rhea_client.js send|recv HOST PORT ADDRESS COUNT
// send: bodies "rhea-0".."rhea-(COUNT-1)", subject "interop", application property {"n": i}; exits 0 once every
//       message is accepted. recv: accepts COUNT messages and prints each as a JSON line {body, subject, n}.
// Any rejection, link or connection error prints it on stderr and exits 1.
'use strict';
const rhea = require('rhea');

const [mode, host, port, address, countText] = process.argv.slice(2);
const count = parseInt(countText, 10);
const container = rhea.create_container({ id: 'rhea-interop-' + mode });

function fail(what, error) {
  const cond = error && (error.condition || error.name);
  const desc = error && (error.description || error.message);
  process.stderr.write(`rhea ${mode}: ${what}: ${cond || ''} ${desc || ''}\n`);
  process.exit(1);
}

container.on('connection_error', (ctx) => fail('connection error', ctx.connection.error));
container.on('sender_error', (ctx) => fail('sender error', ctx.sender.error));
container.on('receiver_error', (ctx) => fail('receiver error', ctx.receiver.error));
container.on('error', (err) => fail('error', err));
container.on('disconnected', (ctx) => { if (ctx.error) fail('disconnected', ctx.error); });

const conn = container.connect({ host, port: parseInt(port, 10), reconnect: false });

if (mode === 'send') {
  let sent = 0;
  let accepted = 0;
  container.on('sendable', (ctx) => {
    while (ctx.sender.sendable() && sent < count) {
      ctx.sender.send({ body: 'rhea-' + sent, subject: 'interop', application_properties: { n: sent } });
      sent++;
    }
  });
  container.on('accepted', (ctx) => {
    accepted++;
    if (accepted === count) ctx.connection.close();
  });
  container.on('rejected', (ctx) => fail('rejected', ctx.delivery.remote_state && ctx.delivery.remote_state.error));
  container.on('released', () => fail('released', null));
  conn.open_sender(address);
} else if (mode === 'recv') {
  let received = 0;
  container.on('message', (ctx) => {
    const m = ctx.message;
    process.stdout.write(JSON.stringify({ body: m.body, subject: m.subject, n: (m.application_properties || {}).n }) + '\n');
    ctx.delivery.accept();
    received++;
    if (received === count) ctx.connection.close();
  });
  conn.open_receiver({ source: address, credit_window: Math.min(count, 100), autoaccept: false });
} else {
  fail('usage', { description: 'mode must be send or recv' });
}
