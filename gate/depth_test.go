package gate

import (
	"testing"
	"time"
)

func TestDepthEstimate(t *testing.T) {
	var d depthEstimate
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, ok := d.estimate(t0, time.Second); ok {
		t.Fatal("an estimate before any count")
	}
	d.counted(t0, 100)
	d.admitted(5)
	if n, ok := d.estimate(t0.Add(500*time.Millisecond), time.Second); !ok || n != 105 {
		t.Errorf("estimate = %d, %v; want 105 from the count plus admissions since", n, ok)
	}
	if _, ok := d.estimate(t0.Add(1500*time.Millisecond), time.Second); ok {
		t.Error("an estimate older than the refresh period is used")
	}
	if _, ok := d.estimate(t0.Add(time.Millisecond), -1); ok {
		t.Error("a negative refresh must always count")
	}
	d.counted(t0.Add(-time.Second), 7) // an older count finishing late
	if n, _ := d.estimate(t0.Add(time.Millisecond), time.Second); n != 105 {
		t.Errorf("a late older count replaced a newer one: %d", n)
	}
	if depthMargin(2000) != 200 || depthMargin(50) != 20 {
		t.Errorf("margins: %d %d", depthMargin(2000), depthMargin(50))
	}
}
