//! Watching and steering a running gateway. In this version: the live statistics line and
//! the totals report printed on shutdown. (The admin interface, metrics, reload and systemd
//! integration land here next.)

pub mod live;
