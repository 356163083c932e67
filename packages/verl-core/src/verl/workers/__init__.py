"""Role workers: the actor/rollout/reference process and the critic, written once against verl.engine_protocol."""
