"""resumeguard quickstart (LangGraph Python): park at an approval, then answer it once.

    export DATABASE_URL=postgres://postgres@127.0.0.1:6432/postgres   # what `resumeguard serve` printed
    pip install langgraph==1.2.22 langgraph-checkpoint-postgres==3.2.0 "psycopg[binary,pool]==3.3.9"
    python examples/python/quickstart.py

The graph is `approve` (asks with interrupt()) -> `ship`. The first invoke parks at the
question; the second answers it with Command(resume=...). Nothing here knows about the
proxy: DATABASE_URL points at it instead of at PostgreSQL. Afterwards
`resumeguard audit --thread order-42` tells the story, approver included.
"""

import json
import os
from typing import TypedDict

from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt


class Order(TypedDict):
    order: str
    approved: bool
    shipped: bool


def approve(state: Order) -> dict:
    # Parks the run here; the value passed to Command(resume=...) comes back as `answer`.
    answer = interrupt({"question": f"ship {state['order']}?"})
    return {"approved": bool(answer)}


def ship(state: Order) -> dict:
    return {"shipped": state["approved"]}


builder = StateGraph(Order)
builder.add_node("approve", approve)
builder.add_node("ship", ship)
builder.add_edge(START, "approve")
builder.add_edge("approve", "ship")
builder.add_edge("ship", END)

with PostgresSaver.from_conn_string(os.environ["DATABASE_URL"]) as checkpointer:
    checkpointer.setup()
    graph = builder.compile(checkpointer=checkpointer)
    # user_id lands in the checkpoint metadata; the audit names it as the approver.
    config = {"configurable": {"thread_id": "order-42", "user_id": "alice"}}

    parked = graph.invoke({"order": "order-42", "approved": False, "shipped": False}, config)
    print("parked:", json.dumps(parked["__interrupt__"][0].value, separators=(",", ":")))

    done = graph.invoke(Command(resume=True), config)
    print("resumed:", json.dumps({k: done[k] for k in ("order", "approved", "shipped")},
                                separators=(",", ":")))
