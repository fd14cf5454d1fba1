package opsmetrics

// Waiting is how many scrapes of c wait for the read in progress.
func Waiting(c *Collector) int {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	return c.waiting
}
