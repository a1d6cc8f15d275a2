"""Errors for bad user input. Every message names the field and says how to fix it."""


class InvalidInputError(ValueError):
    """User input (annotation, spec field, config) that gpushare refuses.

    ``field`` is the annotation key or spec path; ``fix`` tells the user what to write instead.
    """

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field}: {problem}; {fix}")

    def __reduce__(self) -> tuple[type["InvalidInputError"], tuple[str, str, str]]:
        # Pickled as its three parts (the admission process receives refusals from the
        # controller: gpushare.cluster.admission.link).
        return (type(self), (self.field, self.problem, self.fix))
