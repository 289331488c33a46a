"""The gateway: how agents, manager agents and event buses hand their work to the lakehouse."""
