"""Agent functions of the tests, loaded by path as a user's would be (not named agents.py: that
name, on the test path, would shadow the openai-agents package that verifiers imports)."""

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


async def _work(working):
    """Some work of the agent's own (a tool, a call to another service), counted while it runs."""
    working["now"] += 1
    working["most"] = max(working["most"], working["now"])
    await asyncio.sleep(0.05)
    working["now"] -= 1


WORKING = {"now": 0, "most": 0}


async def busy_agent(client, row):
    messages = [{"role": "user", "content": "q"}]
    for _ in range(2):
        await _work(WORKING)
        reply = await client.chat.completions.create(model="m", messages=messages)
        messages.append(reply.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": "again"})
    await _work(WORKING)
    return 1.0


async def lookup_agent(client, row):
    """recipe=tool_tiny's task through the endpoint: the first turn is answered with the secret
    digit as the lookup tool's message; the second is scored by the run's reward provider. No
    tool schemas are sent: rendered into the prompt they would not fit the tiny recipe's 32."""
    messages = [{"role": "user", "content": "What is the secret digit?"}]
    first = await client.chat.completions.create(model="policy", messages=messages)
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    secret = f"secret {row['ground_truth']}"
    messages.append({"role": "tool", "tool_call_id": "lookup", "content": secret})
    await client.chat.completions.create(model="policy", messages=messages)
    return None
