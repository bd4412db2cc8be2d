// Node 18 (Debian 12's nodejs) exposes Web Crypto only as `webcrypto` of node:crypto;
// @langchain/core calls the global `crypto.getRandomValues` that Node >= 19 defines.
// lg.mjs imports this module first, so the global exists before LangChain loads.
import { webcrypto } from "node:crypto";

if (globalThis.crypto === undefined) globalThis.crypto = webcrypto;
