/**
 * Errors of the pi extension. Every one carries a stable `code`, so pi's tools (which format
 * `error.code` where present) and tests can tell them apart without parsing messages.
 *
 *   SandboxError                 root
 *   ├── SandboxUnavailableError  SANDBOX_UNAVAILABLE: no server, it exited, its pipe broke
 *   ├── SandboxTimeoutError      SANDBOX_TIMEOUT: the server did not answer in time
 *   ├── SandboxProtocolError     SANDBOX_PROTOCOL: the server sent something we cannot read
 *   ├── SandboxRpcError          data.code of a JSON-RPC error, else RPC_ERROR
 *   └── SandboxToolError         the ToolResult's error_code (TOOL_DENIED, TOOL_FAILED, ...)
 */

import type { ToolResult } from "./protocol.ts";

export class SandboxError extends Error {
	readonly code: string;

	constructor(code: string, message: string) {
		super(message);
		this.name = new.target.name;
		this.code = code;
	}
}

export class SandboxUnavailableError extends SandboxError {
	constructor(message: string) {
		super("SANDBOX_UNAVAILABLE", message);
	}
}

export class SandboxTimeoutError extends SandboxError {
	constructor(message: string) {
		super("SANDBOX_TIMEOUT", message);
	}
}

export class SandboxProtocolError extends SandboxError {
	constructor(message: string) {
		super("SANDBOX_PROTOCOL", message);
	}
}

export class SandboxRpcError extends SandboxError {
	readonly rpcCode: number;
	readonly data: unknown;

	constructor(rpcCode: number, message: string, data: unknown) {
		const dataCode =
			typeof data === "object" && data !== null && typeof (data as { code?: unknown }).code === "string"
				? (data as { code: string }).code
				: "RPC_ERROR";
		super(dataCode, message);
		this.rpcCode = rpcCode;
		this.data = data;
	}
}

export class SandboxToolError extends SandboxError {
	readonly result: ToolResult;

	constructor(tool: string, result: ToolResult) {
		const code = result.error_code ?? "TOOL_FAILED";
		super(code, `sandbox ${tool}: ${code}: ${result.content || "(no message)"}`);
		this.result = result;
	}
}
