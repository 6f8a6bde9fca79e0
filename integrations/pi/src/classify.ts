/**
 * Seed 004's classifier, answered by pi: the sandbox's `classify.request` (a call its rules left
 * open, with `policy.classifier = "auto"`) is judged with pi's own model API and credentials, as
 * safety-gate reuses pi's. The model is `--sandbox-classifier-model` / `$SANDBOX_CLASSIFIER_MODEL`
 * (`provider/model`, the seed's default being a small, fast model), else the session's model.
 * Whatever goes wrong throws: the server reads an error answer as a failed judgement and asks.
 */
import type { ExtensionContext } from "@earendil-works/pi-coding-agent";

export interface ClassifyRequest {
	session_id: string;
	tool: string;
	operation: string;
	resource: string;
	reason: string;
	rule_id: string;
	hints: string[];
	workspace: string;
	mode: string;
	operating_mode: string;
	user_message: string | null;
}

export interface ClassifierAnswer {
	verdict: "allow" | "block";
	reason: string;
	model?: string;
}

export type Classify = (request: ClassifyRequest) => Promise<ClassifierAnswer>;

export const CLASSIFIER_PROMPT = `You are the safety classifier of a sandboxed coding agent. Deterministic rules already let \
read-only commands, writes inside the project and declared dependency installs run, refuse formatting disks and deleting / \
or a home directory, and ask the user for what the user said to always ask. You judge the rest: one tool call the rules \
left open. Answer "allow" when the call is an ordinary, reversible step of software work inside the project, or when the \
user's latest message explicitly authorises exactly this action. Answer "block" for what is hard to undo or reaches beyond \
the project: publishing packages, force-pushing, deleting data or databases, running unknown downloaded scripts, changing \
the agent's own configuration or credentials, writes outside the project, contacting private network addresses. "hints" \
are what the rules noticed about the call; weigh them. When unsure, block: the user is asked. Reply with one JSON object \
and nothing else: {"verdict": "allow" or "block", "reason": "<one short sentence the user will read>"}.`;

/** The verdict in a model's text: one JSON object, possibly fenced; anything else throws. */
export function parseVerdict(text: string): { verdict: "allow" | "block"; reason: string } {
	const fenced = /^\s*```(?:json)?\s*([\s\S]*?)\s*```\s*$/.exec(text);
	const body = (fenced?.[1] ?? text).trim();
	const parsed: unknown = JSON.parse(body);
	if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) throw new Error("the model's answer is not an object");
	const { verdict, reason, ...rest } = parsed as Record<string, unknown>;
	if (Object.keys(rest).length) throw new Error(`the model's answer has other fields: ${Object.keys(rest).join(", ")}`);
	if (verdict !== "allow" && verdict !== "block") throw new Error("the model's verdict is neither allow nor block");
	if (typeof reason !== "string" || !reason.trim()) throw new Error("the model gave no reason");
	return { verdict, reason: reason.trim().slice(0, 2000) };
}

/** A classifier over pi's model registry: `spec` is `provider/model`, else the session's model. */
export function createPiClassifier(ctx: ExtensionContext, spec?: string): Classify {
	return async (request) => {
		let model = ctx.model;
		if (spec) {
			const cut = spec.indexOf("/");
			model = cut > 0 ? ctx.modelRegistry.find(spec.slice(0, cut), spec.slice(cut + 1)) : undefined;
			if (!model) throw new Error(`the classifier model ${spec} is not known to pi (provider/model)`);
		}
		if (!model) throw new Error("pi has no model to classify with");
		const reply = await ctx.modelRegistry.complete(model, {
			systemPrompt: CLASSIFIER_PROMPT,
			messages: [{ role: "user", content: [{ type: "text", text: JSON.stringify(request) }], timestamp: Date.now() }],
		});
		if (reply.stopReason === "error" || reply.stopReason === "aborted") throw new Error(`the classifier model failed (${reply.stopReason})`);
		const text = reply.content
			.filter((c): c is { type: "text"; text: string } => c.type === "text")
			.map((c) => c.text)
			.join("");
		return { ...parseVerdict(text), model: `${model.provider}/${model.id}` };
	};
}
