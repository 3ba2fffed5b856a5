// E2B's own JS SDK suite (copied from an e2b-dev/E2B checkout by run.mjs) on node only: the
// browser, runtime and template-build projects of its own config are left out.
import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    include: ['tests/**/*.test.ts'],
    exclude: ['tests/runtimes/**', 'tests/template/**', 'tests/connectionConfig.test.ts'],
    isolate: true,
    globals: false,
    testTimeout: 60_000,
    hookTimeout: 60_000,
    environment: 'node',
    setupFiles: ['tests/globalFetchFallback.setup.ts', 'tests/moat_sandbox_hosts.setup.ts'],
    deps: { interopDefault: true },
  },
})
