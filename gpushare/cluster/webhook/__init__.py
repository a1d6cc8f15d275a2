"""The admission webhook: mutate and validate gpushare pods (``review``) and the webhook
configurations the controller registers (``registration``). docs/scheduling.md."""
