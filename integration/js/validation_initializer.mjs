// The CheckpointerTestInitializer that @langchain/langgraph-checkpoint-validation
// runs its conformance suite with (validation.test.mjs): each checkpointer gets a
// fresh database, created and dropped over RG_VALIDATION_DSN (its database part is
// replaced), so the suite runs the same straight to PostgreSQL and through the proxy.

import "./webcrypto.mjs";
import crypto from "node:crypto";
import pg from "pg";
import { PostgresSaver } from "@langchain/langgraph-checkpoint-postgres";

const base = process.env.RG_VALIDATION_DSN;
if (!base) throw new Error("RG_VALIDATION_DSN is not set");

function dsnFor(database) {
  const url = new URL(base);
  url.pathname = `/${database}`;
  return url.toString();
}

async function admin(sql) {
  const client = new pg.Client({ connectionString: dsnFor("postgres") });
  await client.connect();
  try {
    await client.query(sql);
  } finally {
    await client.end();
  }
}

const databases = new WeakMap();

export default {
  checkpointerName: "@langchain/langgraph-checkpoint-postgres",
  async createCheckpointer() {
    const database = `lgv_${crypto.randomBytes(6).toString("hex")}`;
    await admin(`CREATE DATABASE ${database}`);
    const saver = PostgresSaver.fromConnString(dsnFor(database));
    await saver.setup();
    databases.set(saver, database);
    return saver;
  },
  async destroyCheckpointer(saver) {
    await saver.end();
    await admin(`DROP DATABASE IF EXISTS ${databases.get(saver)}`);
  },
};
