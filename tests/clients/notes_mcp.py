"""An MCP server on stdio, as Codex starts the servers in its config: one tool, ``add``, each
call appended to the file named by the first argument (so a test can see it ran)."""

import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("notes")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    with open(sys.argv[1], "a", encoding="utf-8") as f:
        f.write(f"add {a} {b}\n")
    return a + b


if __name__ == "__main__":
    server.run("stdio")
