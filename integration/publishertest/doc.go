// Package publishertest holds the helpers that the relay's tests share, in publisher/ and in
// integration/: a test database with a connection to a test-owned broker and the stream made on
// it, a relay on both, outbox rows written in bulk and counted, the stream read back through a
// consumer of its own with a check that each row arrived exactly once, and a relay's metrics on
// a registry of the test's own.
//
// Like every package in integration/, it is for test files only; nothing that ships imports it.
package publishertest
