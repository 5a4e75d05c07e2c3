"""The original bot's memory tool, step by step, as pure functions (no I/O): `arguments` (the model's tool
arguments), `resolver` (the target user), `naming` and `text` (display names, sanitising), `notice` (the
channel notice), `outcome` (every result a shard gets), `state` (what the steps read), `plan` (a save the
steps decided), `limits` (the length and count limits), `steps` (the order)."""

__all__ = ["arguments", "limits", "naming", "notice", "outcome", "plan", "resolver", "state", "steps", "text"]
