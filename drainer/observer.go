package drainer

// Observer is told what a Drainer did as it happens: a test signal, so that tests wait on events
// rather than on time. Production leaves Config.Observer nil, which costs a nil check per event.
// Methods are called from the drainer's own goroutines (the pass, the dispatches), possibly
// concurrently, and must return quickly: the drainer waits for them.
type Observer interface {
	// Claimed is called after a pass committed jobIDs as dispatched, before any is sent.
	Claimed(jobIDs []int64)
	// Recorded is called after the drainer has dealt with an executor's answer to the dispatch
	// of jobID: recorded it, or found it fenced off, or given up recording it.
	Recorded(jobID int64)
}

// ObserverFuncs is an Observer made of optional functions; a nil field ignores its event.
type ObserverFuncs struct {
	OnClaimed  func(jobIDs []int64)
	OnRecorded func(jobID int64)
}

// Claimed calls OnClaimed, if set.
func (o ObserverFuncs) Claimed(jobIDs []int64) {
	if o.OnClaimed != nil {
		o.OnClaimed(jobIDs)
	}
}

// Recorded calls OnRecorded, if set.
func (o ObserverFuncs) Recorded(jobID int64) {
	if o.OnRecorded != nil {
		o.OnRecorded(jobID)
	}
}
