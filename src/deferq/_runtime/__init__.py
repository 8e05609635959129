"""The queue runtime: tasks, the queue, context serialization, the operator API and configuration."""
