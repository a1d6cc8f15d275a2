"""The admission webhook: mutate and validate gpushare pods (``review``), from what it refuses
(``checks``) and what it adds (``patch``), with a few facts from the view (``facts``), and the
webhook configurations the controller registers (``registration``). docs/scheduling.md."""
