// poll runs f now and then every ms until signal aborts; a failure is
// handed to onError (and polling goes on: the API may come back).
export function poll(signal: AbortSignal, ms: number, f: () => Promise<void>, onError: (e: unknown) => void): void {
  let timer = 0;
  const tick = async () => {
    if (signal.aborted) return;
    try {
      await f();
    } catch (e) {
      if (!signal.aborted) onError(e);
    }
    if (!signal.aborted) timer = window.setTimeout(tick, ms);
  };
  signal.addEventListener('abort', () => window.clearTimeout(timer));
  void tick();
}
