// Stands in for the wildcard DNS record an operator gives moat serve's domain: every TLS
// connection this test worker opens to a host under $E2B_DOMAIN (`<port>-<id>.<domain>`, E2B's
// sandbox host names, which the suite fetches over https on port 443) goes to moat serve's envd
// listener ($MOAT_UPSTREAM_SANDBOX_HOSTS, host:port) instead, with the name kept for SNI, the
// certificate check and the Host header. Nothing else changes: the request, its name and the
// certificate served for it are real; only the address the name resolves to is supplied.
import tls from 'node:tls'

const target = process.env.MOAT_UPSTREAM_SANDBOX_HOSTS
const domain = process.env.E2B_DOMAIN
if (target && domain) {
  const colon = target.lastIndexOf(':')
  const address = target.slice(0, colon)
  const port = Number(target.slice(colon + 1))
  const suffix = `.${domain.toLowerCase()}`
  const connect = tls.connect
  const underDomain = (name: unknown) =>
    typeof name === 'string' && name.toLowerCase().replace(/\.$/, '').endsWith(suffix)
  // tls.connect(options[, callback]) is the form node's and undici's fetch use.
  ;(tls as { connect: typeof tls.connect }).connect = function (...args: unknown[]) {
    const options = args[0]
    if (options && typeof options === 'object') {
      const o = options as { host?: string; servername?: string; port?: number }
      const name = o.servername || o.host
      if (underDomain(name)) {
        args[0] = { ...o, host: address, port, servername: name }
      }
    }
    return (connect as (...a: unknown[]) => tls.TLSSocket).apply(tls, args)
  } as typeof tls.connect
}
