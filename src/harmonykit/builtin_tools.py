"""The built-in tool namespaces gpt-oss was trained with (browser, python).

Data, not code: the exact descriptions and schemas the model expects, as in the
reference's golden renderings (shared/reference/openai-harmony/test-data).

The texts are openai-harmony's, verbatim (Apache-2.0, Copyright OpenAI); see NOTICE.
"""

from __future__ import annotations

from typing import Any

BROWSER: dict[str, Any] = {
    "name": "browser",
    "description": "Tool for browsing.\nThe `cursor` appears in brackets before each browsing display: `[{cursor}]`.\nCite information from the tool using the following format:\n`【{cursor}†L{line_start}(-L{line_end})?】`, for example: `【6†L9-L11】` or `【8†L3】`.\nDo not quote more than 10 words directly from the tool output.\nsources=web (default: web)",
    "tools": [
        {
            "name": "search",
            "description": "Searches for information related to `query` and displays `topn` results.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {
                        "type": "string"
                    },
                    "topn": {
                        "type": "number",
                        "default": 10
                    },
                    "source": {
                        "type": "string"
                    }
                },
                "required": [
                    "query"
                ]
            }
        },
        {
            "name": "open",
            "description": "Opens the link `id` from the page indicated by `cursor` starting at line number `loc`, showing `num_lines` lines.\nValid link ids are displayed with the formatting: `【{id}†.*】`.\nIf `cursor` is not provided, the most recent page is implied.\nIf `id` is a string, it is treated as a fully qualified URL associated with `source`.\nIf `loc` is not provided, the viewport will be positioned at the beginning of the document or centered on the most relevant passage, if available.\nUse this function without `id` to scroll to a new location of an opened page.",
            "parameters": {
                "type": "object",
                "properties": {
                    "id": {
                        "type": [
                            "number",
                            "string"
                        ],
                        "default": -1
                    },
                    "cursor": {
                        "type": "number",
                        "default": -1
                    },
                    "loc": {
                        "type": "number",
                        "default": -1
                    },
                    "num_lines": {
                        "type": "number",
                        "default": -1
                    },
                    "view_source": {
                        "type": "boolean",
                        "default": False
                    },
                    "source": {
                        "type": "string"
                    }
                }
            }
        },
        {
            "name": "find",
            "description": "Finds exact matches of `pattern` in the current page, or the page given by `cursor`.",
            "parameters": {
                "type": "object",
                "properties": {
                    "pattern": {
                        "type": "string"
                    },
                    "cursor": {
                        "type": "number",
                        "default": -1
                    }
                },
                "required": [
                    "pattern"
                ]
            }
        }
    ]
}

PYTHON: dict[str, Any] = {
    "name": "python",
    "description": "Use this tool to execute Python code in your chain of thought. The code will not be shown to the user. This tool should be used for internal reasoning, but not for code that is intended to be visible to the user (e.g. when creating plots, tables, or files).\n\nWhen you send a message containing Python code to python, it will be executed in a stateful Jupyter notebook environment. python will respond with the output of the execution or time out after 120.0 seconds. The drive at '/mnt/data' can be used to save and persist user files. Internet access for this session is UNKNOWN. Depends on the cluster.",
    "tools": []
}
