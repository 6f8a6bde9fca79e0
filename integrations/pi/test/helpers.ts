import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, realpathSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { AgentToolResult } from "@earendil-works/pi-coding-agent";
import type { SandboxCallContext } from "../src/operations.ts";
import type { PermissionMode } from "../src/protocol.ts";
import { type Approver, SandboxSession } from "../src/session.ts";

const here = path.dirname(fileURLToPath(import.meta.url));

/** The real server: $SANDBOX_BIN, else the repository's virtualenv. */
export const SANDBOX_BIN = process.env.SANDBOX_BIN || path.resolve(here, "../../../.venv/bin/sandbox");
export const FAKE_SERVER = path.join(here, "fixtures/fake-server.mjs");

export interface Sandbox {
	workspace: string;
	dataDir: string;
	session: SandboxSession;
	ctx: (approver?: Approver) => SandboxCallContext;
	close: () => Promise<void>;
}

/**
 * Where tests make their directories: not under /tmp, because the jail mounts a private tmpfs
 * on /tmp, so a write "outside the workspace" into the host's /tmp would land in the jail's.
 */
export const TEST_ROOT = process.env.PI_SANDBOX_TEST_TMP || (existsSync("/var/tmp") ? "/var/tmp" : tmpdir());

export function tempDir(prefix: string): string {
	return realpathSync(mkdtempSync(path.join(TEST_ROOT, prefix)));
}

/** A real `sandbox serve` on a fresh workspace and data directory. */
export async function openSandbox(options: { mode?: PermissionMode; approver?: Approver } = {}): Promise<Sandbox> {
	const workspace = tempDir("pi-sbx-ws-");
	const dataDir = tempDir("pi-sbx-data-");
	const removeDirs = () => {
		rmSync(workspace, { recursive: true, force: true });
		rmSync(dataDir, { recursive: true, force: true });
	};
	const session = await SandboxSession.open({
		bin: SANDBOX_BIN,
		workspace,
		mode: options.mode ?? "auto",
		approver: options.approver,
		env: { ...process.env, SANDBOX_DATA_DIR: dataDir },
		clientName: "pi-extension-tests",
	}).catch((error: unknown) => {
		removeDirs();
		throw error;
	});
	return {
		workspace,
		dataDir,
		session,
		ctx: (approver) => ({ session: async () => session, approver, idPrefix: "test" }),
		close: async () => {
			await session.close();
			removeDirs();
		},
	};
}

export function text(result: AgentToolResult<unknown>): string {
	return result.content.map((block) => (block.type === "text" ? block.text : `[${block.type}]`)).join("\n");
}

/** pids whose command line contains `marker` (pgrep -f), ours excluded. */
export function pgrep(marker: string): number[] {
	try {
		return execFileSync("pgrep", ["-f", marker], { encoding: "utf8" })
			.split("\n")
			.filter(Boolean)
			.map(Number)
			.filter((pid) => pid !== process.pid);
	} catch {
		return []; // pgrep exits 1 when nothing matches
	}
}

export async function waitFor(check: () => boolean, timeoutMs: number, stepMs = 50): Promise<boolean> {
	const deadline = Date.now() + timeoutMs;
	while (Date.now() < deadline) {
		if (check()) return true;
		await new Promise((resolve) => setTimeout(resolve, stepMs));
	}
	return check();
}

let schemaCache: Record<string, unknown> | undefined;

/** The server's own protocol schema (`sandbox serve --schema`). */
export function serverSchema(): Record<string, unknown> {
	schemaCache ??= JSON.parse(execFileSync(SANDBOX_BIN, ["serve", "--schema"], { encoding: "utf8" })) as Record<string, unknown>;
	return schemaCache;
}

/** Whether the server's Read takes `raw` (needed by pi's read and edit). */
export function serverHasRawRead(): boolean {
	const tools = serverSchema().tools as Record<string, { properties?: Record<string, unknown> }> | undefined;
	return tools?.Read?.properties?.raw !== undefined;
}
