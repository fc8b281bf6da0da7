"""The controller: the step pipeline, its default stages, and the training loop."""
