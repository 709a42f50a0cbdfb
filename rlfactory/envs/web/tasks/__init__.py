"""WebArena-format tasks on the self-hosted sites: templates and their instances (`build`), the evaluator
(`evaluator`), and an HTTP-level demonstrator that follows each task's plan (`http_solver`)."""
