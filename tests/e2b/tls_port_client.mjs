// The client half of ports.test.mjs's TLS case, run in a node of its own so that the e2b SDK's
// fetch trusts the test's CA (NODE_EXTRA_CA_CERTS is read when node starts): creates a sandbox
// on the moat serve that E2B_API_URL and E2B_SANDBOX_URL name (https), starts an http.server in
// it, and fetches a file through https://<port>-<id>.<domain> with the wildcard certificate
// checked against the name. Prints one JSON line {status, body, host}; exits 1 on any failure.
import https from 'node:https';
import { readFileSync } from 'node:fs';

import { Sandbox } from 'e2b';

const [domain, port, caFile] = process.argv.slice(2);
const ca = readFileSync(caFile);

function lookup(hostname, options, callback) {
    if (options && options.all) callback(null, [{ address: '127.0.0.1', family: 4 }]);
    else callback(null, '127.0.0.1', 4);
}

function get(host, path) {
    return new Promise((resolve, reject) => {
        https.get({ host, port: Number(port), path, lookup, ca, servername: host, agent: false }, (r) => {
            let body = '';
            r.setEncoding('utf8');
            r.on('data', (d) => { body += d; });
            r.on('end', () => resolve({ status: r.statusCode, body }));
        }).on('error', reject);
    });
}

const sbx = await Sandbox.create();
try {
    await sbx.files.write('/home/user/site/hello.txt', 'hello over TLS\n');
    await sbx.commands.run('python -m http.server 8000', { background: true, cwd: '/home/user/site' });
    const host = sbx.getHost(8000);
    if (!host.endsWith('.' + domain)) throw new Error(`getHost gave ${host}`);
    let answer;
    for (let i = 0; i < 200; ++i) {
        answer = await get(host, '/hello.txt');
        if (answer.status !== 502) break;
        await new Promise((r) => setTimeout(r, 100));
    }
    console.log(JSON.stringify({ ...answer, host }));
} finally {
    await sbx.kill();
}
