package agent

func (a *Agent) mountExtra() {}
