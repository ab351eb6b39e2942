//! The L7 waypoint (`ambit waypoint`).
