"""MCP both ways: `server` exposes the tool registry and task control (`coder mcp serve`),
each call inside `walls` (the git guard, leftovers ended) and, over HTTP, behind `token`;
`client` brings external MCP servers' tools into a run, and `attach` adds them to a run's
agent session. Nothing here imports the `mcp` SDK at
module level except where it is used (it costs ~0.4 s), so importing this package is cheap.

May import: run, tools and everything below. Never the CLI."""
