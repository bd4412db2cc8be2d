// @langchain/langgraph-checkpoint-validation's conformance suite over the JS saver,
// as a vitest file (test_saver_suites.py runs it straight to PostgreSQL and through
// the proxy and compares the results test by test).
import { validate } from "@langchain/langgraph-checkpoint-validation";
import initializer from "./validation_initializer.mjs";

validate(initializer);
