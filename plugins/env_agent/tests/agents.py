"""Agent functions of the tests, loaded by path as a user's would be."""

import asyncio
import json

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up the secret.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]


async def tool_agent(client, row):
    messages = [{"role": "user", "content": row["question"]}]
    first = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    message = first.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "secret is 7"})
    second = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    return {"reward": float("7" in (second.choices[0].message.content or "")), "metrics": {"x": 2}}


async def raises(client, row):
    raise ValueError("agent bug")


async def hangs(client, row):
    await asyncio.sleep(3600)


async def rewrites(client, row):
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}])
    return 1.0


def not_async(client, row):
    return json.dumps(row)
