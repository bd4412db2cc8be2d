// resumeguard quickstart (LangGraph.js): park at an approval, then answer it once.
//
//   export DATABASE_URL=postgres://postgres@127.0.0.1:6432/postgres   # what `resumeguard serve` printed
//   cd examples/js && npm install     # the versions pinned in package.json
//   node quickstart.mjs
//
// The graph is `approve` (asks with interrupt()) -> `ship`. The first invoke parks at
// the question; the second answers it with new Command({ resume }). Nothing here knows
// about the proxy: DATABASE_URL points at it instead of at PostgreSQL.

import { Annotation, Command, END, START, StateGraph, interrupt } from "@langchain/langgraph";
import { PostgresSaver } from "@langchain/langgraph-checkpoint-postgres";

const Order = Annotation.Root({
  order: Annotation(),
  approved: Annotation(),
  shipped: Annotation(),
});

const builder = new StateGraph(Order)
  // Parks the run here; the value passed to Command({ resume }) comes back as the answer.
  .addNode("approve", (state) => ({ approved: Boolean(interrupt({ question: `ship ${state.order}?` })) }))
  .addNode("ship", (state) => ({ shipped: state.approved }))
  .addEdge(START, "approve")
  .addEdge("approve", "ship")
  .addEdge("ship", END);

const checkpointer = PostgresSaver.fromConnString(process.env.DATABASE_URL);
await checkpointer.setup();
const graph = builder.compile({ checkpointer });
// user_id lands in the checkpoint metadata; the audit names it as the approver.
const config = { configurable: { thread_id: "order-43", user_id: "alice" } };

const parked = await graph.invoke({ order: "order-43", approved: false, shipped: false }, config);
console.log("parked:", JSON.stringify(parked.__interrupt__[0].value));

const done = await graph.invoke(new Command({ resume: true }), config);
const { order, approved, shipped } = done;
console.log("resumed:", JSON.stringify({ order, approved, shipped }));
await checkpointer.end();
