/**
 * Plugin tools through the sandbox, and other extensions' tools through its gate, against the real
 * server: a plugin is registered only after the user's grant, its tool runs in the jail (JSON in and
 * out), and a tool of another extension is checked (asked, audited) before pi may run it.
 */
import assert from "node:assert/strict";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { discoverManifests, explicitManifests, needsCheck, pluginResult } from "../src/plugins.ts";
import type { ApprovalRequest } from "../src/protocol.ts";
import { SandboxSession } from "../src/session.ts";
import { SANDBOX_BIN, tempDir, text } from "./helpers.ts";
import { answeringInTurn, loadExtension, sessionDirs } from "./support.ts";

const TOOL = `import json, os, sys
args = json.load(sys.stdin)
print(json.dumps({"content": "shouted " + args["text"].upper(), "details": {"dir": os.environ["SANDBOX_PLUGIN_DIR"], "cwd": os.getcwd()}}))
`;

function writePlugin(root: string, id = "loud"): string {
	const dir = path.join(root, id);
	mkdirSync(dir, { recursive: true });
	writeFileSync(path.join(dir, "tool.py"), TOOL);
	const manifest = path.join(dir, "plugin.json");
	const tool = {
		name: "shout",
		description: "Shout a text",
		parameters: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
		risk: "low",
		command: ["python3", "${PLUGIN_DIR}/tool.py"],
	};
	writeFileSync(manifest, JSON.stringify({ id, tools: [tool] }));
	return manifest;
}

/** The extension over a stand-in ExtensionAPI; `others` are tools other extensions registered. */
function loadWithOthers(others: string[]) {
	return loadExtension({}, (tools) => ({
		getAllTools: () => [
			...["read", "bash", "todo"].map((name) => ({ name, sourceInfo: { source: "builtin", path: `builtin:${name}` } })),
			...others.map((name) => ({ name, sourceInfo: { source: "extension", path: "/ext/other.ts" } })),
			...[...tools.keys()].map((name) => ({ name, sourceInfo: { source: "extension", path: "/ext/sandbox.ts" } })),
		],
	}));
}

describe("plugin tools", () => {
	const dirs = sessionDirs("plugin");
	let root: string;
	before(() => {
		root = tempDir("pi-sbx-plugins-");
	});
	after(() => rmSync(root, { recursive: true, force: true }));

	it("finds manifests in the folders and the explicit list", () => {
		const folder = path.join(root, "folder");
		mkdirSync(path.join(folder, "nested"), { recursive: true });
		writeFileSync(path.join(folder, "a.json"), "{}");
		writeFileSync(path.join(folder, "nested", "plugin.json"), "{}");
		writeFileSync(path.join(folder, "notes.txt"), "");
		const found = discoverManifests(explicitManifests("/x/one.json:/x/two.json", undefined), [folder, path.join(root, "absent")]);
		assert.deepEqual(found, ["/x/one.json", "/x/two.json", path.join(folder, "a.json"), path.join(folder, "nested", "plugin.json")]);
	});

	it("checks every tool but pi's core tools and the extension's own", () => {
		const all = [
			{ name: "read", sourceInfo: { source: "builtin", path: "builtin:read" } },
			{ name: "mcp_search", sourceInfo: { source: "builtin", path: "builtin:mcp" } },
			{ name: "web_search", sourceInfo: { source: "extension", path: "/x.ts" } },
		];
		const ours = new Set(["bash", "plugin_loud_shout"]);
		assert.deepEqual(
			["read", "bash", "plugin_loud_shout", "mcp_search", "web_search", "unknown"].map((n) => needsCheck(n, ours, all)),
			[false, false, false, true, true, true],
		);
		assert.deepEqual(pluginResult({ ok: false, content: "no", error_code: "TIMEOUT", details: {} }).isError, true);
	});

	it("registers only after the user's grant, then runs the tool in the jail", async () => {
		const seen: ApprovalRequest[] = [];
		const answers = ["deny", "allow-once"] as const;
		let index = 0;
		const session = await SandboxSession.open({
			bin: SANDBOX_BIN,
			workspace: dirs.workspace,
			mode: "ask",
			plugins: [writePlugin(root)],
			env: { ...process.env, SANDBOX_DATA_DIR: dirs.dataDir },
		});
		try {
			assert.equal(session.info.plugins?.[0]?.registered, false);
			const approver = (request: ApprovalRequest) => (seen.push(request), answers[index++] ?? "deny");
			const refused = await session.registerPlugin("loud", { approver });
			assert.equal(refused.registered, false);
			const before = await session.call("plugin_loud_shout", { text: "hi" });
			assert.equal(before.error_code, "TOOL_DENIED");
			const granted = await session.registerPlugin("loud", { approver });
			assert.equal(granted.registered, true);
			assert.deepEqual(
				seen.map((r) => [r.operation, r.tool, r.resource]),
				[
					["register", "plugin.loud", "plugin_loud_shout (risk low)"],
					["register", "plugin.loud", "plugin_loud_shout (risk low)"],
				],
			);
			const listed = await session.listTools();
			assert.ok(listed.some((t) => t.name === "plugin_loud_shout" && t.risk === "low"));
			const result = await session.call("plugin_loud_shout", { text: "hi" });
			assert.equal(result.content, "shouted HI");
			assert.deepEqual(result.details.result_details, { dir: "/run/sandbox/plugins/loud", cwd: dirs.workspace });
			const invalid = await session.call("plugin_loud_shout", { text: 5 });
			assert.equal(invalid.error_code, "INVALID_ARGUMENT");
		} finally {
			await session.close();
		}
	});

	it("the extension asks before registering, exposes the tool and gates other extensions' tools", async () => {
		const manifest = writePlugin(path.join(root, "ext"), "ext");
		process.env.SANDBOX_PLUGINS = manifest;
		process.env.SANDBOX_DATA_DIR = dirs.dataDir;
		process.env.SANDBOX_BIN = SANDBOX_BIN;
		const { tools, emit } = loadWithOthers(["web_search"]);
		const { ctx, asked, notes } = answeringInTurn(dirs.workspace, ["Allow once", "Allow once", "Deny"]);
		try {
			await emit("session_start", { type: "session_start", reason: "startup" }, ctx);
			assert.match(asked[0] ?? "", /plugin\.ext to register plugin_ext_shout \(risk low\)/);
			assert.match(notes.join("\n"), /plugin ext registered: plugin_ext_shout/);
			const shout = tools.get("plugin_ext_shout");
			assert.ok(shout, "the plugin tool is registered with pi");
			const result = await shout.execute("t1", { text: "yo" }, undefined, undefined, ctx);
			assert.equal(text(result), "shouted YO");

			const allowed = await emit("tool_call", { toolName: "web_search", toolCallId: "w1", input: { q: "x" } }, ctx);
			assert.equal(allowed, undefined);
			assert.match(asked[1] ?? "", /web_search/);
			const blocked = (await emit("tool_call", { toolName: "web_search", toolCallId: "w2", input: { q: "y" } }, ctx)) as { block: boolean; reason: string };
			assert.equal(blocked.block, true);
			assert.match(blocked.reason, /denied/);
			for (const name of ["read", "todo", "plugin_ext_shout"]) {
				assert.equal(await emit("tool_call", { toolName: name, toolCallId: "x", input: {} }, ctx), undefined, name);
			}
			assert.equal(asked.length, 3);
		} finally {
			await emit("session_shutdown", { type: "session_shutdown" }, ctx);
			delete process.env.SANDBOX_PLUGINS;
		}
	});
});
