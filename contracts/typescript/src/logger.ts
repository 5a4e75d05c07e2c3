/** Where the kit reports what it does not hand to a callback; pass your own (pino, winston, ...). */
export interface Logger {
  debug(message: string, fields?: Record<string, unknown>): void;
  info(message: string, fields?: Record<string, unknown>): void;
  warn(message: string, fields?: Record<string, unknown>): void;
  error(message: string, fields?: Record<string, unknown>): void;
}

/** The default: warnings and errors to the console, debug and info dropped. */
export const consoleLogger: Logger = {
  debug: () => {},
  info: () => {},
  warn: (message, fields) => console.warn(`[ltm-client] ${message}`, fields ?? {}),
  error: (message, fields) => console.error(`[ltm-client] ${message}`, fields ?? {}),
};
