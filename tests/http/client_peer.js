// The peer of tests/http_client_test.cpp: a Node http (or, with --tls CERT KEY, https) server on
// 127.0.0.1 with one route per behaviour the client must handle. Prints its port on stdout, then
// serves until stdin closes (the test holds stdin open, so the server dies with the test).
//
//   node client_peer.js [--tls cert.pem key.pem]
'use strict';
const http = require('http');
const https = require('https');

const args = process.argv.slice(2);
let server;
const stats = {connections: 0, written: 0, lastHeaders: {}, requests: 0};

function handler(req, res) {
    const url = new URL(req.url, 'http://x');
    const path = url.pathname;
    stats.requests++;
    if (path !== '/stats') stats.lastHeaders = req.headers;
    if (path === '/hello') {
        res.writeHead(200, {'Content-Type': 'text/plain', 'Content-Length': 5});
        res.end('hello');
    } else if (path === '/stats') {
        const body = JSON.stringify(stats);
        res.writeHead(200, {'Content-Type': 'application/json', 'Content-Length': body.length});
        res.end(body);
    } else if (path === '/echo') {
        // The request body back, with how it was framed.
        const pieces = [];
        req.on('data', (d) => pieces.push(d));
        req.on('end', () => {
            const body = Buffer.concat(pieces);
            res.writeHead(200, {
                'Content-Length': body.length,
                'X-Request-Transfer-Encoding': req.headers['transfer-encoding'] || '',
                'X-Request-Content-Length': req.headers['content-length'] || '',
            });
            res.end(body);
        });
    } else if (path === '/chunked') {
        // A chunked response of `n` pieces "piece <i>\n".
        const n = Number(url.searchParams.get('n') || 10);
        res.writeHead(200, {'Content-Type': 'text/plain'});  // no length: chunked
        let i = 0;
        const next = () => {
            if (i === n) return res.end();
            res.write(`piece ${i++}\n`, next);
        };
        next();
    } else if (path === '/big') {
        // `bytes` bytes of 'x', written only as fast as the client takes them (respecting
        // backpressure), counting what was handed to the socket.
        const total = Number(url.searchParams.get('bytes'));
        res.writeHead(200, {'Content-Length': total});
        const block = Buffer.alloc(64 * 1024, 'x');
        let left = total;
        const pump = () => {
            while (left > 0) {
                const n = Math.min(left, block.length);
                left -= n;
                stats.written += n;
                const more = res.write(n === block.length ? block : block.subarray(0, n));
                if (!more) return res.once('drain', pump);
            }
            res.end();
        };
        stats.written = 0;
        pump();
    } else if (path === '/stall') {
        // The head and part of the body, then nothing.
        res.writeHead(200, {'Content-Length': 100});
        res.write('0123456789');
    } else if (path === '/never') {
        // No response at all.
    } else if (path === '/truncated') {
        res.writeHead(200, {'Content-Length': 100});
        res.write('0123456789', () => req.socket.end());
    } else if (path === '/reset-mid') {
        res.writeHead(200, {'Content-Length': 1000000});
        res.write(Buffer.alloc(1000, 'y'), () => setTimeout(() => req.socket.resetAndDestroy(), 50));
    } else if (path === '/reset') {
        req.socket.resetAndDestroy();
    } else if (path === '/garbage') {
        req.socket.end('HTTP/1.1 two hundred OK\r\nthis is not http\r\n\r\n');
    } else if (path === '/oversize-head') {
        req.socket.end('HTTP/1.1 200 OK\r\nX-Big: ' + 'a'.repeat(70 * 1024) +
                       '\r\nContent-Length: 0\r\n\r\n');
    } else if (path === '/too-long-body') {
        res.writeHead(200, {'Content-Length': 2048});
        res.end(Buffer.alloc(2048, 'z'));
    } else if (path === '/redirect') {
        res.writeHead(302, {'Location': '/hello', 'Content-Length': 0});
        res.end();
    } else if (path === '/close') {
        // Answers, then closes the connection (no keep-alive).
        res.writeHead(200, {'Content-Length': 2, 'Connection': 'close'});
        res.end('ok');
    } else if (path === '/interim') {
        res.writeProcessing();  // 102, skipped by the client
        res.writeHead(200, {'Content-Length': 2});
        res.end('ok');
    } else {
        res.writeHead(404, {'Content-Length': 0});
        res.end();
    }
}

if (args[0] === '--tls') {
    const fs = require('fs');
    server = https.createServer({cert: fs.readFileSync(args[1]), key: fs.readFileSync(args[2])},
                                handler);
    server.on('secureConnection', () => stats.connections++);
} else {
    server = http.createServer(handler);
    server.on('connection', () => stats.connections++);
}
server.keepAliveTimeout = 60000;
server.listen(0, '127.0.0.1', () => {
    process.stdout.write(`${server.address().port}\n`);
});
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
