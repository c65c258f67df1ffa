package orchestrator

// ConsoleLog returns the path of a sandbox's guest console log (the
// kernel's and the guest agent's lines) while its VM runs, "" while it has
// none (paused: the console goes with the stopped VM).
func (o *Orchestrator) ConsoleLog(id string) (string, error) {
	s, err := o.lookup(id)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.vm == nil || s.vm.Machine == nil {
		return "", nil
	}
	return s.vm.Machine.Info().ConsoleLog, nil
}
