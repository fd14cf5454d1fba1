// Package drainertest holds the helpers that the drainer's tests share, in drainer/ and in
// integration/: a test database with a fake clock, queued jobs written in bulk or one at a time,
// a drainer the test drives or runs itself, executors the test scripts, holds or lets finish,
// readers of jobs and a check of every tenant's queue state against its jobs, and a database
// pool that logs every round trip it sends, for the tests that pin what a drainer asks of the
// database.
//
// Like every package in integration/, it is for test files only; nothing that ships imports it.
package drainertest
