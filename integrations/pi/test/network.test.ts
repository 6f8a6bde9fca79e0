/**
 * An allowlist session from pi: the hosts pi names reach the server (`allow_hosts`), a refused
 * connection reaches pi as it happens (`network.denied`) and the model reads one line about it.
 * Nothing leaves the machine: the refused host is refused before any name is resolved.
 */
import assert from "node:assert/strict";
import { rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import type { ApprovalRequest, NetworkDenial } from "../src/protocol.ts";
import { SandboxSession } from "../src/session.ts";
import { SANDBOX_BIN, tempDir } from "./helpers.ts";

describe("network allowlist", () => {
	let workspace: string;
	let dataDir: string;
	before(() => {
		workspace = tempDir("pi-sbx-net-ws-");
		dataDir = tempDir("pi-sbx-net-data-");
	});
	after(() => {
		rmSync(workspace, { recursive: true, force: true });
		rmSync(dataDir, { recursive: true, force: true });
	});

	it("a host off the list is refused, pi hears of it at once, and the model reads why", async () => {
		const denials: NetworkDenial[] = [];
		const session = await SandboxSession.open({
			bin: SANDBOX_BIN,
			workspace,
			mode: "auto",
			backend: "bwrap",
			allowHosts: ["allowed.example"],
			onDenial: (denial) => denials.push(denial),
			env: { ...process.env, SANDBOX_DATA_DIR: dataDir },
		});
		try {
			const result = await session.call("Bash", { command: 'echo "$https_proxy"; curl -sSf http://denied.example/' });
			assert.equal(result.ok, false);
			assert.match(result.content, /^http:\/\/127\.0\.0\.1:3128$/m);
			assert.match(result.content, /sandbox: connection to denied\.example:80 refused \(not-allowed\)/);
			assert.deepEqual(
				denials.map((d) => [d.host, d.port, d.reason]),
				[["denied.example", 80, "not-allowed"]],
			);
		} finally {
			await session.close();
		}
	});

	it("with network.ask a host no rule names is put to pi's approver, with the running call's id", async () => {
		const profile = path.join(workspace, "ask.toml");
		writeFileSync(profile, 'requires = []\n[network]\nmode = "allowlist"\nask = true\n');
		const asked: ApprovalRequest[] = [];
		const session = await SandboxSession.open({
			bin: SANDBOX_BIN,
			workspace,
			mode: "auto",
			backend: "bwrap",
			profile,
			env: { ...process.env, SANDBOX_DATA_DIR: dataDir },
		});
		try {
			const result = await session.call(
				"Bash",
				{ command: "curl -sSf http://unlisted.example/" },
				{ idPrefix: "net", approver: (request) => (asked.push(request), "deny") },
			);
			assert.equal(result.ok, false);
			assert.match(result.content, /refused \(ask-denied\)/);
			assert.deepEqual(
				asked.map((r) => [r.tool, r.operation, r.resource]),
				[["Network", "connect", "unlisted.example:80"]],
			);
			assert.match(asked[0]?.tool_call_id ?? "", /^net:/);
		} finally {
			await session.close();
		}
	});
});
