"""The MCP server for agents: the workbench's tools over the job API, local by default,
authenticated over HTTP, with every path confined to the allowed roots (see docs/mcp.md).

    python -m engine.mcp                   # stdio, for Claude Desktop/Code-style clients
    magpie mcp --transport http            # streamable HTTP on 127.0.0.1, bearer token
"""
