package store

// FirstQueuedSince lets the external tests (package store_test) reach firstQueuedSince. They
// are external because they use integration/testdb, which opens its pools with Open.
var FirstQueuedSince = firstQueuedSince
var RecountSQL = recountSQL
