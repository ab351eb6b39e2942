//! placeholder until the agent lands
